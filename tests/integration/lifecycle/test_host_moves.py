"""The host's own moves, on SQLite and on PostgreSQL: cancel (both rows, or neither) and reschedule."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.lifecycle import moves, worklists
from dispatcher.lifecycle.states import AttemptState as A
from dispatcher.lifecycle.states import NotificationState as N
from dispatcher.store.models import Attempt, Notification
from tests.integration.lifecycle.test_moves import NOW, TARGET, notification_of, put, sessions, states

__all__ = ["sessions"]  # the fixture, parametrized over both stores

pytestmark = pytest.mark.integration


def cancel(session: Session, notification_id: int, number: int = 1) -> bool:
    return moves.cancel(session, notification_id=notification_id, number=number, route="reminders",
                        channel="messaging_platform", detail="cancelled by the host", now=NOW)


def claim(session: Session, notification_id: int, attempt_id: int, seen_claims: int = 0) -> bool:
    return moves.claim(session, notification_id=notification_id, attempt_id=attempt_id, fallback=False, target=TARGET,
                       now=NOW, lease_until=NOW + timedelta(seconds=60), seen_claims=seen_claims)


def test_a_scheduled_notification_is_cancelled_and_its_attempt_made_failed_so_no_run_can_open_it(
    sessions: sessionmaker[Session],
) -> None:
    notification_id, _ = put(sessions, N.SCHEDULED, send_at=NOW + timedelta(hours=1))
    with sessions.begin() as session:
        assert cancel(session, notification_id)
    assert states(sessions, notification_id) == (N.CANCELLED, [A.FAILED])
    notification = notification_of(sessions, notification_id)
    assert (notification.error_kind, notification.fallback_decision) == (moves.CANCELLED, None)
    with sessions.begin() as session:  # a run that comes later opens the failed attempt: nothing to send
        row = moves.open_attempt(session, notification_id=notification_id, number=1, route="reminders",
                                 channel="messaging_platform", now=NOW,
                                 columns=(Attempt.__table__.c.id, Attempt.__table__.c.state))
        assert row.state == A.FAILED
        assert not claim(session, notification_id, row.id)
    assert states(sessions, notification_id) == (N.CANCELLED, [A.FAILED])


def test_a_queued_attempt_is_cancelled_and_a_claim_on_what_the_worker_read_loses(sessions: sessionmaker[Session]) -> None:
    notification_id, [attempt_id] = put(sessions, N.QUEUED, A.QUEUED)
    with sessions.begin() as session:
        assert cancel(session, notification_id)
    with sessions.begin() as session:
        assert not claim(session, notification_id, attempt_id)
    assert states(sessions, notification_id) == (N.CANCELLED, [A.FAILED])


def test_a_waiting_attempt_may_be_cancelled_but_not_a_claimed_one(sessions: sessionmaker[Session]) -> None:
    waiting, _ = put(sessions, N.SENDING, A.QUEUED)  # released after a limiter wait or a pause: nothing was sent
    claimed, [attempt_id] = put(sessions, N.QUEUED, A.QUEUED)
    with sessions.begin() as session:
        assert claim(session, claimed, attempt_id)
    unknown, _ = put(sessions, N.SENDING, A.UNKNOWN)  # its message may exist
    with sessions.begin() as session:
        assert cancel(session, waiting)
        assert not cancel(session, claimed)
        assert not cancel(session, unknown)
    assert states(sessions, waiting) == (N.CANCELLED, [A.FAILED])
    assert states(sessions, claimed) == (N.SENDING, [A.IN_FLIGHT])
    assert states(sessions, unknown) == (N.SENDING, [A.UNKNOWN])


def test_a_cancel_that_finds_the_notification_moved_keeps_nothing(sessions: sessionmaker[Session]) -> None:
    # The attempt is queued but the notification has ended (a decision came first): the move
    # raises, and the caller's transaction takes back the attempt's change too.
    notification_id, _ = put(sessions, N.FAILED, A.QUEUED)
    with pytest.raises(moves.CancelLost), sessions.begin() as session:
        cancel(session, notification_id)
    assert states(sessions, notification_id) == (N.FAILED, [A.QUEUED])


def test_the_cancel_is_of_the_current_attempt_only(sessions: sessionmaker[Session]) -> None:
    notification_id, _ = put(sessions, N.FALLING_BACK, A.FAILED, A.QUEUED, fallback_decision="fallback")
    with sessions.begin() as session:
        assert not cancel(session, notification_id, number=1)  # the first attempt failed long ago
        assert cancel(session, notification_id, number=2)
    assert states(sessions, notification_id) == (N.CANCELLED, [A.FAILED, A.FAILED])


def test_reschedule_moves_only_a_scheduled_notification(sessions: sessionmaker[Session]) -> None:
    later = NOW + timedelta(days=1)
    scheduled, _ = put(sessions, N.SCHEDULED, send_at=NOW + timedelta(hours=1))
    queued, _ = put(sessions, N.QUEUED, send_at=NOW - timedelta(hours=1))
    with sessions.begin() as session:
        assert moves.reschedule(session, notification_id=scheduled, send_at=later, now=NOW)
        assert not moves.reschedule(session, notification_id=queued, send_at=later, now=NOW)
    assert notification_of(sessions, scheduled).send_at == later
    assert notification_of(sessions, queued).send_at == NOW - timedelta(hours=1)
    with sessions.begin() as session:  # the sweep's release, after the move: not due any more
        moves.release_due(session, [scheduled], now=NOW + timedelta(hours=2))
    assert states(sessions, scheduled)[0] == N.SCHEDULED


def test_a_cancelled_notification_is_past_every_other_move(sessions: sessionmaker[Session]) -> None:
    notification_id, [attempt_id] = put(sessions, N.QUEUED, A.QUEUED)
    with sessions.begin() as session:
        assert cancel(session, notification_id)
    with sessions.begin() as session:
        session.execute(update(Notification).where(Notification.id == notification_id).values(send_at=NOW))
        moves.release_due(session, [notification_id], now=NOW)
        assert not moves.reschedule(session, notification_id=notification_id, send_at=NOW + timedelta(hours=1), now=NOW)
        assert not moves.decide_fallback(session, notification_id=notification_id, now=NOW, decision=moves.FallbackDecision(
            fall_back=True, reason="send_failed", failed=True, fallback_route="sms", fallback_channel="sms"))
        assert not cancel(session, notification_id)  # a second cancel finds the attempt failed (the service answers it)
    assert states(sessions, notification_id) == (N.CANCELLED, [A.FAILED])


def test_a_cancelled_notification_is_no_failure_waiting_for_its_decision(sessions: sessionmaker[Session]) -> None:
    # the repair sweep looks for failed attempts whose decision is missing; a cancel needs none
    first, _ = put(sessions, N.QUEUED, A.QUEUED)
    fallback, _ = put(sessions, N.FALLING_BACK, A.FAILED, A.QUEUED, fallback_decision="fallback")
    waiting, [attempt_id] = put(sessions, N.SENDING, A.FAILED)  # failed, its decision not made yet: repaired
    with sessions.begin() as session:
        assert cancel(session, first) and cancel(session, fallback, number=2)
    with sessions() as session:
        undecided = worklists.undecided_failures(session, failed_before=NOW + timedelta(days=1), limit=10)
    assert [row[0] for row in undecided] == [waiting]


def test_a_notification_whose_workspace_left_is_set_aside_not_handed_over_forever(sessions: sessionmaker[Session]) -> None:
    notification_id, _ = put(sessions, N.QUEUED, A.QUEUED)
    later = NOW + timedelta(days=1)
    with sessions.begin() as session:
        assert moves.set_aside(session, notification_id=notification_id, detail="its workspace is not configured",
                               now=NOW, error_kind=moves.WORKSPACE_UNCONFIGURED)
    with sessions.begin() as session:  # the sweep leaves it (it took it every stale_after_s before)
        assert notification_id not in [row.id for row in worklists.due_for_enqueue(session, now=later, stale_before=later, limit=10,
                                                                send_queue_empty=True)]
    with sessions.begin() as session:  # once the workspace is back, an operator's retry hands it over again
        assert moves.retry_set_aside(session, notification_id=notification_id, now=later)
        assert notification_id in [row.id for row in worklists.due_for_enqueue(session, now=later, stale_before=later, limit=10,
                                                            send_queue_empty=True)]
