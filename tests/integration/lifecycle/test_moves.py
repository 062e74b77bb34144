"""Every lifecycle move, allowed and refused, on SQLite and on PostgreSQL.

Each test puts rows in a chosen state (test code may; the dispatcher may not), runs one move, and
checks both that it answered whether it won and what is then stored: a refused move writes nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, update
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.lifecycle import moves, worklists
from dispatcher.lifecycle.states import AttemptState as A
from dispatcher.lifecycle.states import NotificationState as N
from dispatcher.store.account import TOP_LEVEL_INSTANCE, Account
from dispatcher.store.db import make_engine, session_factory
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import (
    Attempt,
    ContactInbox,
    ConversationLink,
    KnownContact,
    Notification,
    Payload,
    ServiceWindow,
)

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
EVENT_NUMBERS = itertools.count(1)
TARGET = moves.Target(inbox_id=1, contact_id=7, conversation_id=3, channel="messaging_platform", content_hash="h" * 64)


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'moves.sqlite'}"
    else:
        url = request.getfixturevalue("fresh_postgres_url")
    upgrade_database(url)
    engine = make_engine(url)
    try:
        yield session_factory(engine)
    finally:
        engine.dispose()


def put(sessions: sessionmaker[Session], state: str, *attempts: str, fallback_decision: str | None = None,
        lease_until: datetime | None = None, send_at: datetime | None = None) -> tuple[int, list[int]]:
    """A notification in ``state`` with attempts 1.. in the given states; their IDs."""
    with sessions.begin() as session:
        fell_back = fallback_decision == "fallback"
        notification = Notification(event_id=f"event-{next(EVENT_NUMBERS)}", fingerprint="f" * 64, route="reminders",
                                    fallback_route="sms", state=state, fallback_decision=fallback_decision, send_at=send_at,
                                    current_attempt=len(attempts) if fell_back else 1, created_at=NOW, updated_at=NOW)
        session.add(notification)
        session.flush()
        rows = [Attempt(notification_id=notification.id, number=number, route="reminders", channel="messaging_platform",
                        purpose="fallback" if fell_back and number > 1 else "first",
                        state=attempt_state, tries=1, lease_until=lease_until, created_at=NOW, updated_at=NOW)
                for number, attempt_state in enumerate(attempts, start=1)]
        session.add_all(rows)
        session.flush()
        return notification.id, [row.id for row in rows]


def states(sessions: sessionmaker[Session], notification_id: int) -> tuple[str, list[str]]:
    with sessions() as session:
        notification = session.get(Notification, notification_id)
        assert notification is not None
        attempts = session.scalars(select(Attempt.state).where(Attempt.notification_id == notification_id)
                                   .order_by(Attempt.number)).all()
        return notification.state, list(attempts)


def notification_of(sessions: sessionmaker[Session], notification_id: int) -> Notification:
    with sessions() as session:
        found = session.get(Notification, notification_id)
        assert found is not None
        session.expunge(found)
        return found


def test_create_and_open_attempt(sessions: sessionmaker[Session]) -> None:
    assert moves.new_notification(send_at=None, event_id="x").state == N.QUEUED
    assert moves.new_notification(send_at=NOW, event_id="y").state == N.SCHEDULED
    notification_id, _ = put(sessions, N.QUEUED)
    with sessions.begin() as session:
        columns = (Attempt.__table__.c.tries, Attempt.__table__.c.runs)
        first = moves.open_attempt(session, notification_id=notification_id, number=1, route="reminders",
                                   channel="messaging_platform", now=NOW, columns=columns)
        again = moves.open_attempt(session, notification_id=notification_id, number=1, route="reminders",
                                   channel="messaging_platform", now=NOW, columns=columns)
    # each run counts a run (the crash guard), never a provider try
    assert (first.runs, again.runs, first.tries, again.tries) == (1, 2, 0, 0)
    assert states(sessions, notification_id) == (N.QUEUED, [A.QUEUED])


ACCOUNT = Account(TOP_LEVEL_INSTANCE, 1)


def load(session: Session, notification_id: int, channels: dict[str, str]) -> tuple[Any, moves.CountedRun | None]:
    loaded = moves.load_and_count_run(session, notification_id=notification_id, channels=channels, inboxes={},
                                      account=ACCOUNT, now=NOW)
    assert loaded.target is None and loaded.target_inbox_id is None  # no inbox known: no target read
    return loaded.notification, loaded.attempt


def test_load_and_count_run_counts_only_a_run_with_something_to_send(sessions: sessionmaker[Session]) -> None:
    """The claim's first read, one statement on PostgreSQL: the notification as a send reads it, and
    its current attempt with the run counted (made by its first run, with its route's channel), only
    while it is to be sent and its route is configured; else the attempt is None and nothing is written."""
    channels = {"reminders": "messaging_platform", "sms": "sms"}
    fresh, _ = put(sessions, N.QUEUED)
    ended, [ended_attempt] = put(sessions, N.DELIVERED, A.DELIVERED)
    fell_back, [_, fallback] = put(sessions, N.FALLING_BACK, A.FAILED, A.QUEUED, fallback_decision="fallback")
    with sessions.begin() as session:
        first, counted = load(session, fresh, channels)
        _, again = load(session, fresh, channels)
        assert first is not None and counted is not None and again is not None
        assert (first.id, first.state, first.attempt_route, first.body) == (fresh, N.QUEUED, None, None)  # read before the count
        assert (counted.id, counted.state, counted.runs, counted.tries, counted.claims) == (again.id, A.QUEUED, 1, 0, 0)
        assert again.runs == 2
        gone = load(session, 10**9, channels)
        done, not_counted = load(session, ended, channels)
        unconfigured, none_made = load(session, fresh, {"sms": "sms"})
        later, its_run = load(session, fell_back, channels)
    assert gone == (None, None)
    assert done is not None and done.state == N.DELIVERED and not_counted is None
    assert unconfigured is not None and none_made is None
    assert later is not None and (later.current_attempt, later.attempt_route) == (2, "reminders")
    assert its_run is not None and (its_run.id, its_run.runs) == (fallback, 1)  # its row, made by the decision: counted
    with sessions() as session:
        made = session.execute(select(Attempt.notification_id, Attempt.route, Attempt.channel, Attempt.runs)
                               .where(Attempt.notification_id.in_([fresh, ended]))).all()
        assert sorted(made) == sorted([(fresh, "reminders", "messaging_platform", 2), (ended, "reminders",
                                                                                      "messaging_platform", 0)])
        assert session.get(Attempt, ended_attempt) is not None
    with sessions.begin() as session:  # the fallback's route no longer configured: its run is not counted
        _, uncounted = load(session, fell_back, {"sms": "sms"})
    assert uncounted is None


def test_the_load_reads_the_cached_target_by_the_payloads_keys_on_postgresql(sessions: sessionmaker[Session]) -> None:
    """The warm claim's target (contact, source_id, conversation, last incoming message) comes with
    the load on PostgreSQL, found by the keyed hashes the payload holds (identifier first) for the
    route's inbox as the process knows it. SQLite, a payload without keys or an inbox not known:
    none is read (the claim asks store.cached_target)."""
    channels = {"reminders": "messaging_platform", "sms": "sms"}
    known = {"by-id": 11, "by-phone": 12}
    with sessions.begin() as session:
        for key, contact_id in known.items():
            session.add(KnownContact(**ACCOUNT.columns, identity_key=key, contact_id=contact_id, created_at=NOW))
            session.add(ContactInbox(**ACCOUNT.columns, contact_id=contact_id, inbox_id=7, source_id=f"source-{contact_id}"))
            session.add(ConversationLink(**ACCOUNT.columns, contact_id=contact_id, inbox_id=7, conversation_id=contact_id + 100))
        session.add(ServiceWindow(**ACCOUNT.columns, contact_id=12, inbox_id=7, last_incoming_at=NOW))
        session.add(KnownContact(instance="elsewhere", account_id=1, identity_key="by-other", contact_id=13, created_at=NOW))

    def with_payload(body: dict[str, object] | None) -> int:
        notification_id, _ = put(sessions, N.QUEUED)
        if body is not None:
            with sessions.begin() as session:
                session.add(Payload(notification_id=notification_id, body=body))
        return notification_id

    def target(notification_id: int, inboxes: dict[str, int]) -> tuple[object, ...] | None:
        with sessions.begin() as session:
            loaded = moves.load_and_count_run(session, notification_id=notification_id, channels=channels,
                                              inboxes=inboxes, account=ACCOUNT, now=NOW)
        assert loaded.attempt is not None  # counted, whatever was known
        if loaded.target is None:
            return None
        return (loaded.target_inbox_id, loaded.target.contact_id, loaded.target.source_id,
                loaded.target.conversation_id, loaded.target.last_incoming_at is not None)

    both = with_payload({"content": "x", "contact": {}, "contact_keys": ["by-id", "by-phone"]})
    phone_first = with_payload({"content": "x", "contact": {}, "contact_keys": ["unknown", "by-phone", "by-id"]})
    nobody = with_payload({"content": "x", "contact": {}, "contact_keys": ["unknown", "by-other"]})
    unkeyed = with_payload({"content": "x", "contact": {}})
    if sessions.kw["bind"].dialect.name == "sqlite":
        assert [target(row, {"reminders": 7}) for row in (both, phone_first, nobody, unkeyed)] == [None] * 4
        return
    assert target(both, {"reminders": 7}) == (7, 11, "source-11", 111, False)  # the identifier's, listed first
    assert target(phone_first, {"reminders": 7}) == (7, 12, "source-12", 112, True)  # the first key known
    assert target(both, {"reminders": 8}) == (8, 11, None, None, False)  # another inbox: the contact, nothing else
    assert target(nobody, {"reminders": 7}) == (7, None, None, None, False)  # another instance's key is not ours
    assert target(both, {"sms": 7}) is None  # the attempt's route's inbox is not known
    assert target(unkeyed, {"reminders": 7}) is None  # stored before the keys were: not read with the load


def test_release_due_moves_only_scheduled_rows_whose_time_came(sessions: sessionmaker[Session]) -> None:
    due, _ = put(sessions, N.SCHEDULED, send_at=NOW)
    moved_later, _ = put(sessions, N.SCHEDULED, send_at=NOW + timedelta(hours=1))  # rescheduled after the sweep's query
    sending, _ = put(sessions, N.SENDING)
    with sessions.begin() as session:
        moves.release_due(session, [due, moved_later, sending], now=NOW)
    assert states(sessions, due)[0] == N.QUEUED
    assert states(sessions, moved_later)[0] == N.SCHEDULED
    assert states(sessions, sending)[0] == N.SENDING


def test_claim_takes_a_queued_attempt_once(sessions: sessionmaker[Session]) -> None:
    notification_id, [attempt_id] = put(sessions, N.QUEUED, A.QUEUED)
    lease = NOW + timedelta(seconds=60)
    with sessions.begin() as session:
        assert moves.claim(session, notification_id=notification_id, attempt_id=attempt_id, fallback=False,
                           target=TARGET, now=NOW, lease_until=lease, seen_claims=0)
    with sessions.begin() as session:  # a twin, while the lease lives
        assert not moves.claim(session, notification_id=notification_id, attempt_id=attempt_id, fallback=False,
                               target=TARGET, now=NOW + timedelta(seconds=1), lease_until=lease, seen_claims=1)
    assert states(sessions, notification_id) == (N.SENDING, [A.IN_FLIGHT])
    claimed = notification_of(sessions, notification_id)
    assert claimed.conversation_id == TARGET.conversation_id
    # the claiming run holds the row's run lease (the sweep's, issue 44): started, touched now
    assert (claimed.task_started, claimed.enqueued_at) == (True, NOW)
    with sessions.begin() as session:  # the lease ran out: a worker may take it again
        assert moves.claim(session, notification_id=notification_id, attempt_id=attempt_id, fallback=False,
                           target=TARGET, now=lease + timedelta(seconds=1), lease_until=lease + timedelta(seconds=60),
                           seen_claims=1)


def test_a_worker_that_read_the_attempt_before_another_claim_cannot_claim_it(sessions: sessionmaker[Session]) -> None:
    # Two workers read the attempt (queued, no claim yet) and looked for an earlier message: none.
    notification_id, [attempt_id] = put(sessions, N.QUEUED, A.QUEUED)
    with sessions.begin() as session:  # the first claims; its call's answer is lost (the message may exist)
        assert moves.claim(session, notification_id=notification_id, attempt_id=attempt_id, fallback=False,
                           target=TARGET, now=NOW, lease_until=NOW + timedelta(seconds=60), seen_claims=0)
        assert moves.mark_unknown(session, attempt_id=attempt_id, seen_claims=1, now=NOW)
    with sessions.begin() as session:  # the second, on what it read before: refused, it did not look since
        assert not moves.claim(session, notification_id=notification_id, attempt_id=attempt_id, fallback=False,
                               target=TARGET, now=NOW, lease_until=NOW + timedelta(seconds=60), seen_claims=0)
    assert states(sessions, notification_id) == (N.SENDING, [A.UNKNOWN])
    with sessions.begin() as session:  # a worker that read it after the first claim (and looked) may
        assert moves.claim(session, notification_id=notification_id, attempt_id=attempt_id, fallback=False,
                           target=TARGET, now=NOW, lease_until=NOW + timedelta(seconds=60), seen_claims=1)


def test_claim_of_the_fallback_keeps_falling_back_and_refuses_an_ended_attempt(sessions: sessionmaker[Session]) -> None:
    notification_id, [_, second] = put(sessions, N.FALLING_BACK, A.FAILED, A.QUEUED, fallback_decision="fallback")
    with sessions.begin() as session:  # the first route's message, as the notification showed it before the fallback
        session.execute(update(Notification).where(Notification.id == notification_id)
                        .values(message_id=77, inbox_id=1, conversation_id=5, accepted_at=NOW))
    with sessions.begin() as session:
        assert moves.claim(session, notification_id=notification_id, attempt_id=second, fallback=True, target=TARGET,
                           now=NOW, lease_until=NOW + timedelta(seconds=60), seen_claims=0)
    assert states(sessions, notification_id) == (N.FALLING_BACK, [A.FAILED, A.IN_FLIGHT])
    claimed = notification_of(sessions, notification_id)  # it describes the fallback's call: no message yet
    assert (claimed.message_id, claimed.accepted_at, claimed.conversation_id) == (None, None, TARGET.conversation_id)
    ended, [attempt_id] = put(sessions, N.SENT, A.SENT)
    with sessions.begin() as session:
        assert not moves.claim(session, notification_id=ended, attempt_id=attempt_id, fallback=False, target=TARGET,
                               now=NOW, lease_until=NOW, seen_claims=0)
    assert states(sessions, ended) == (N.SENT, [A.SENT])


def test_release_and_mark_unknown_only_from_in_flight(sessions: sessionmaker[Session]) -> None:
    notification_id, [attempt_id] = put(sessions, N.SENDING, A.IN_FLIGHT)
    with sessions.begin() as session:
        assert moves.mark_unknown(session, attempt_id=attempt_id, seen_claims=0, now=NOW,
                                  no_resend=("unreadable_answer", "createMessage answered 200 without a readable body"))
        assert not moves.release(session, attempt_id=attempt_id, seen_claims=0, now=NOW)  # it is unknown now, not in flight
    assert states(sessions, notification_id) == (N.SENDING, [A.UNKNOWN])
    other, [in_flight] = put(sessions, N.SENDING, A.IN_FLIGHT)
    with sessions.begin() as session:
        assert moves.release(session, attempt_id=in_flight, seen_claims=0, now=NOW)
        assert not moves.mark_unknown(session, attempt_id=in_flight, seen_claims=0, now=NOW)
    assert states(sessions, other) == (N.SENDING, [A.QUEUED])


def test_a_run_cannot_move_an_attempt_another_run_claimed_since_it_read_it(sessions: sessionmaker[Session]) -> None:
    # One run read the attempt queued (claims 0) and is still looking the contact up; another
    # claims it (claims 1) and calls createMessage. What the first run meets (a refusal, a 404,
    # a refused token, a lost answer) is about its own calls: the attempt stays the other run's.
    notification_id, [attempt_id] = put(sessions, N.QUEUED, A.QUEUED)
    lease = NOW + timedelta(seconds=45)
    with sessions.begin() as session:
        assert moves.claim(session, notification_id=notification_id, attempt_id=attempt_id, fallback=False,
                           target=TARGET, now=NOW, lease_until=lease, seen_claims=0)
    with sessions.begin() as session:
        assert not moves.fail_attempt(session, notification_id=notification_id, attempt_id=attempt_id, seen_claims=0,
                                      error_kind="rejected", detail="422", now=NOW)
        assert not moves.re_resolve(session, attempt_id=attempt_id, seen_claims=0, now=NOW)
        assert not moves.release(session, attempt_id=attempt_id, seen_claims=0, now=NOW)
        assert not moves.mark_unknown(session, attempt_id=attempt_id, seen_claims=0, now=NOW)
        moves.wait_for_workspace(session, notification_id=notification_id, attempt_id=attempt_id, seen_claims=0,
                                 reason="auth", detail="401", now=NOW)
        # a caller that never read it (past the send deadline) leaves it while the lease lives
        assert not moves.fail_attempt(session, notification_id=notification_id, attempt_id=attempt_id, seen_claims=None,
                                      error_kind="auth", detail="past the send deadline", now=NOW)
    assert states(sessions, notification_id) == (N.SENDING, [A.IN_FLIGHT])
    with sessions.begin() as session:  # the run that holds the claim may end it
        assert moves.fail_attempt(session, notification_id=notification_id, attempt_id=attempt_id, seen_claims=1,
                                  error_kind="rejected", detail="422", now=NOW)
    assert states(sessions, notification_id) == (N.SENDING, [A.FAILED])
    other, [expired] = put(sessions, N.SENDING, A.IN_FLIGHT, lease_until=NOW - timedelta(seconds=1))
    with sessions.begin() as session:  # a lease that ran out holds nothing
        assert moves.fail_attempt(session, notification_id=other, attempt_id=expired, seen_claims=None,
                                  error_kind="auth", detail="past the send deadline", now=NOW)


def _counts(sessions: sessionmaker[Session], attempt_id: int) -> tuple[int, int]:
    with sessions() as session:
        found = session.get(Attempt, attempt_id)
        assert found is not None
        return found.tries, found.runs


def test_a_try_is_counted_per_failed_call_up_to_the_limit_and_only_while_the_attempt_may_send(
        sessions: sessionmaker[Session]) -> None:
    _, [attempt_id] = put(sessions, N.QUEUED, A.QUEUED)  # put counts one try
    with sessions.begin() as session:
        assert moves.count_try(session, attempt_id=attempt_id, now=NOW, max_tries=3) == 2
        assert moves.count_try(session, attempt_id=attempt_id, now=NOW, max_tries=3) == 3
        assert moves.count_try(session, attempt_id=attempt_id, now=NOW, max_tries=3) is None  # never past the limit
    _, [accepted] = put(sessions, N.ACCEPTED, A.ACCEPTED)
    with sessions.begin() as session:
        assert moves.count_try(session, attempt_id=accepted, now=NOW, max_tries=3) is None
    assert (_counts(sessions, attempt_id)[0], _counts(sessions, accepted)[0]) == (3, 1)


def test_a_run_that_ends_without_dying_gives_its_run_back_never_below_zero(sessions: sessionmaker[Session]) -> None:
    notification_id, _ = put(sessions, N.QUEUED)
    with sessions.begin() as session:
        attempt = moves.open_attempt(session, notification_id=notification_id, number=1, route="reminders",
                                     channel="messaging_platform", now=NOW, columns=(Attempt.__table__.c.id,))
        assert moves.end_run(session, attempt_id=attempt.id)
        assert not moves.end_run(session, attempt_id=attempt.id)  # never below zero
    assert _counts(sessions, attempt.id) == (0, 0)
    leased, [in_flight] = put(sessions, N.SENDING, A.IN_FLIGHT)
    with sessions.begin() as session:
        session.execute(update(Attempt).where(Attempt.id == in_flight).values(runs=1))
        assert moves.end_run(session, attempt_id=in_flight)  # a twin that waited for a live lease stays in flight
    assert states(sessions, leased) == (N.SENDING, [A.IN_FLIGHT])


def test_a_notification_set_aside_is_left_by_the_sweep_until_an_operator_retries_it(
        sessions: sessionmaker[Session]) -> None:
    notification_id, [attempt_id] = put(sessions, N.SENDING, A.IN_FLIGHT)
    with sessions.begin() as session:
        session.execute(update(Attempt).where(Attempt.id == attempt_id).values(runs=21))
        assert moves.set_aside(session, notification_id=notification_id, detail="died 20 times", now=NOW)
    with sessions.begin() as session:
        due = worklists.due_for_enqueue(session, now=NOW + timedelta(days=1), stale_before=NOW + timedelta(days=1), limit=10,
                                        send_queue_empty=True)
    assert notification_id not in [row.id for row in due]
    with sessions.begin() as session:
        assert moves.retry_set_aside(session, notification_id=notification_id, now=NOW)
        assert not moves.retry_set_aside(session, notification_id=notification_id, now=NOW)  # only one set aside
    with sessions.begin() as session:
        due = worklists.due_for_enqueue(session, now=NOW, stale_before=NOW, limit=10, send_queue_empty=True)
    assert notification_id in [row.id for row in due]
    assert _counts(sessions, attempt_id)[1] == 0
    assert states(sessions, notification_id) == (N.SENDING, [A.IN_FLIGHT])  # its message may exist: looked for first


def test_accept_records_the_message_on_both_and_only_once(sessions: sessionmaker[Session]) -> None:
    notification_id, [attempt_id] = put(sessions, N.SENDING, A.IN_FLIGHT)
    with sessions.begin() as session:
        accepted = moves.accept(session, notification_id=notification_id, attempt_id=attempt_id, message_id=41,
                                state=A.SENT, now=NOW, next_read_at=None)
        assert accepted is not None and accepted.channel == "messaging_platform"
        assert moves.accept(session, notification_id=notification_id, attempt_id=attempt_id, message_id=42,
                            state=A.SENT, now=NOW, next_read_at=None) is None
    assert states(sessions, notification_id) == (N.SENT, [A.SENT])
    notification = notification_of(sessions, notification_id)
    assert (notification.message_id, notification.delivery_state, notification.accepted_at is not None) == (41, "sent", True)


def test_record_outcome_moves_forward_and_mirrors_only_the_current_attempt(sessions: sessionmaker[Session]) -> None:
    notification_id, [attempt_id] = put(sessions, N.SENT, A.SENT)
    with sessions.begin() as session:
        assert moves.record_outcome(session, notification_id=notification_id, attempt_id=attempt_id, attempt_number=1,
                                    current=A.SENT, new=A.DELIVERED, external_error=None, now=NOW)
        assert not moves.record_outcome(session, notification_id=notification_id, attempt_id=attempt_id, attempt_number=1,
                                        current=A.DELIVERED, new=A.FAILED, external_error="131026: x", now=NOW)
        assert not moves.record_outcome(session, notification_id=notification_id, attempt_id=attempt_id, attempt_number=1,
                                        current=A.SENT, new=A.READ, external_error=None, now=NOW)  # stale: it is delivered
    assert states(sessions, notification_id) == (N.DELIVERED, [A.DELIVERED])
    # the first attempt after the decision to fall back: its news no longer moves the notification
    fell_back, [first, _] = put(sessions, N.FALLING_BACK, A.SENT, A.QUEUED, fallback_decision="fallback")
    with sessions.begin() as session:
        assert moves.record_outcome(session, notification_id=fell_back, attempt_id=first, attempt_number=1,
                                    current=A.SENT, new=A.DELIVERED, external_error=None, now=NOW)
    assert states(sessions, fell_back) == (N.FALLING_BACK, [A.DELIVERED, A.QUEUED])


def _outcome_move(notification_id: int, attempt_id: int, current: str, new: str, *, number: int = 1,
                  external_error: str | None = None) -> moves.OutcomeMove:
    return moves.OutcomeMove(notification_id=notification_id, attempt_id=attempt_id, attempt_number=number,
                             current=A(current), new=A(new), external_error=external_error, next_read_at=None)


def test_a_group_records_its_outcomes_one_statement_a_kind_in_order(sessions: sessionmaker[Session]) -> None:
    """The moves of a group of outcomes, as record_outcome would make them one after the other: two
    to delivered together, a failure, a second move of one attempt after its first (a read of
    another attempt before both), and the first attempt of a notification that fell back moved
    without its notification."""
    one, [first] = put(sessions, N.SENT, A.SENT)
    two, [second] = put(sessions, N.ACCEPTED, A.ACCEPTED)
    three, [third] = put(sessions, N.SENT, A.SENT)
    fell_back, [old, _] = put(sessions, N.FALLING_BACK, A.SENT, A.QUEUED, fallback_decision="fallback")
    statements: list[str] = []
    bind = sessions.kw["bind"]

    def keep(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(" ".join(statement.split()).upper())

    event.listen(bind, "before_cursor_execute", keep)
    try:
        with sessions.begin() as session:
            moves.record_outcomes(session, [
                _outcome_move(two, second, A.ACCEPTED, A.READ),  # a read first: one's read must still follow its delivery
                _outcome_move(one, first, A.SENT, A.DELIVERED),
                _outcome_move(one, first, A.DELIVERED, A.READ),
                _outcome_move(three, third, A.SENT, A.FAILED, external_error="131026: undeliverable"),
                _outcome_move(fell_back, old, A.SENT, A.DELIVERED),
            ], now=NOW)
    finally:
        event.remove(bind, "before_cursor_execute", keep)
    assert states(sessions, one) == (N.READ, [A.READ])
    assert states(sessions, two) == (N.READ, [A.READ])
    assert states(sessions, three) == (N.SENT, [A.FAILED])  # the decision follows, as for one failure
    assert notification_of(sessions, three).error_kind is None
    assert states(sessions, fell_back) == (N.FALLING_BACK, [A.DELIVERED, A.QUEUED])
    # two to delivered in one statement (and their notifications in one more); the failure and
    # each read alone (record_outcome: a read is one statement of two CTEs on PostgreSQL)
    assert sum(statement.startswith("UPDATE ATTEMPTS") for statement in statements) == (
        2 if bind.dialect.name == "postgresql" else 4)
    assert sum(statement.startswith("UPDATE NOTIFICATIONS") for statement in statements) == (
        1 if bind.dialect.name == "postgresql" else 3)


def test_a_group_reads_its_attempts_and_records_only_their_new_statuses(sessions: sessionmaker[Session]) -> None:
    """What a group of outcomes reads first (one statement on PostgreSQL): the attempts of its
    messages that are the workspace's, and of the (message, status) pairs only those of these
    messages, each new once, whatever the group repeats."""
    from dispatcher.store import queries as store

    first, [sent] = put(sessions, N.SENT, A.SENT)
    second, [delivered] = put(sessions, N.DELIVERED, A.DELIVERED)
    with sessions.begin() as session:
        session.execute(update(Attempt).where(Attempt.id == sent).values(message_id=7001, workspace="default"))
        session.execute(update(Attempt).where(Attempt.id == delivered).values(message_id=7002, workspace="default"))
    pairs = [(7001, "delivered"), (7001, "read"), (7001, "delivered"), (7002, "read"), (9999, "read")]
    with sessions.begin() as session:
        attempts, new = store.lock_attempts_and_record_statuses(session, "default", [7002, 7001, 9999, 7001], pairs)
        assert sorted(attempts) == [7001, 7002]  # 9999 is no attempt's message: neither read nor recorded
        assert (attempts[7001].id, attempts[7001].notification_id, attempts[7001].state) == (sent, first, A.SENT)
        assert (attempts[7002].id, attempts[7002].notification_id, attempts[7002].state) == (delivered, second, A.DELIVERED)
        assert new == {(7001, "delivered"), (7001, "read"), (7002, "read")}
    with sessions.begin() as session:
        again, none_new = store.lock_attempts_and_record_statuses(session, "default", [7001], [(7001, "read")])
        other, theirs = store.lock_attempts_and_record_statuses(session, "elsewhere", [7001], [(7001, "read")])
        nothing = store.lock_attempts_and_record_statuses(session, "default", [], [])
    assert (sorted(again), none_new) == ([7001], set())
    assert (other, theirs) == ({}, set())  # another workspace's message 7001: not this attempt
    assert nothing == ({}, set())
    with sessions() as session:
        assert store.record_applied_statuses(session, "default", [(9999, "read")]) == {(9999, "read")}  # never recorded


def test_a_group_move_that_finds_its_attempt_elsewhere_refuses_the_group(sessions: sessionmaker[Session]) -> None:
    """The group's locks make every move's guard hold; one that does not (the attempt was moved
    behind the group's back) raises, and its transaction keeps nothing."""
    one, [first] = put(sessions, N.SENT, A.SENT)
    two, [second] = put(sessions, N.DELIVERED, A.DELIVERED)  # the group would think it sent
    for group in ([_outcome_move(one, first, A.SENT, A.DELIVERED), _outcome_move(two, second, A.SENT, A.DELIVERED)],
                  [_outcome_move(two, second, A.SENT, A.READ)]):
        with pytest.raises(moves.OutcomeMoveRefused), sessions.begin() as session:
            moves.record_outcomes(session, group, now=NOW)
    assert states(sessions, one) == (N.SENT, [A.SENT])
    assert states(sessions, two) == (N.DELIVERED, [A.DELIVERED])
    with pytest.raises(moves.OutcomeMoveRefused), sessions.begin() as session:  # no such edge: never written
        moves.record_outcomes(session, [_outcome_move(one, first, A.SENT, A.DELIVERED),
                                        _outcome_move(two, second, A.DELIVERED, A.DELIVERED)], now=NOW)
    assert states(sessions, one) == (N.SENT, [A.SENT])


def test_a_failure_ends_the_attempt_and_leaves_the_notification_to_the_decision(sessions: sessionmaker[Session]) -> None:
    notification_id, [attempt_id] = put(sessions, N.SENT, A.SENT)
    with sessions.begin() as session:
        assert moves.record_outcome(session, notification_id=notification_id, attempt_id=attempt_id, attempt_number=1,
                                    current=A.SENT, new=A.FAILED, external_error="131026: Message undeliverable", now=NOW)
    assert states(sessions, notification_id) == (N.SENT, [A.FAILED])
    refused, [queued] = put(sessions, N.QUEUED, A.QUEUED)
    with sessions.begin() as session:
        assert moves.fail_attempt(session, notification_id=refused, attempt_id=queued, seen_claims=0, error_kind="not_contactable",
                                  detail="the contact has no phone number", now=NOW)
        assert not moves.fail_attempt(session, notification_id=refused, attempt_id=queued, seen_claims=0, error_kind="again", detail="",
                                      now=NOW)
    assert states(sessions, refused) == (N.QUEUED, [A.FAILED])
    assert notification_of(sessions, refused).error_kind == "not_contactable"


def test_the_fallback_decision_is_made_once(sessions: sessionmaker[Session]) -> None:
    notification_id, _ = put(sessions, N.SENT, A.FAILED)
    fall_back = moves.FallbackDecision(fall_back=True, reason="undeliverable (131026)", failed=True,
                                       fallback_route="sms", fallback_channel="sms")
    with sessions.begin() as session:
        assert moves.decide_fallback(session, notification_id=notification_id, decision=fall_back, now=NOW)
        assert not moves.decide_fallback(session, notification_id=notification_id, decision=fall_back, now=NOW)
    assert states(sessions, notification_id) == (N.FALLING_BACK, [A.FAILED, A.QUEUED])
    assert notification_of(sessions, notification_id).fallback_decision == "fallback"


def test_a_failed_decision_ends_the_notification_with_its_reason(sessions: sessionmaker[Session]) -> None:
    notification_id, _ = put(sessions, N.SENT, A.FAILED)
    end = moves.FallbackDecision(fall_back=False, reason="template_misconfigured (132001)", failed=True,
                                 error_kind="external_error", error_detail="132001: Template name does not exist")
    with sessions.begin() as session:
        assert moves.decide_fallback(session, notification_id=notification_id, decision=end, now=NOW)
    notification = notification_of(sessions, notification_id)
    assert (notification.state, notification.error_kind) == (N.FAILED, "external_error")
    assert notification.error_detail == "132001: Template name does not exist"
    # a deadline without a route decides without moving the state
    waiting, _ = put(sessions, N.SENT, A.SENT)
    with sessions.begin() as session:
        assert moves.decide_fallback(session, notification_id=waiting,
                                     decision=moves.FallbackDecision(fall_back=False, reason="deadline", failed=False),
                                     now=NOW)
    assert states(sessions, waiting) == (N.SENT, [A.SENT])


def test_a_deadline_decision_is_refused_once_the_message_is_delivered(sessions: sessionmaker[Session]) -> None:
    at_deadline = moves.FallbackDecision(fall_back=True, reason="not delivered by the deadline", failed=False,
                                         fallback_route="sms", fallback_channel="sms")
    delivered, _ = put(sessions, N.DELIVERED, A.DELIVERED)
    still_sent, _ = put(sessions, N.SENT, A.SENT)
    with sessions.begin() as session:
        assert not moves.decide_fallback(session, notification_id=delivered, decision=at_deadline, now=NOW)
        assert moves.decide_fallback(session, notification_id=still_sent, decision=at_deadline, now=NOW)
    assert states(sessions, delivered) == (N.DELIVERED, [A.DELIVERED])
    assert notification_of(sessions, delivered).fallback_decision is None
    assert states(sessions, still_sent) == (N.FALLING_BACK, [A.SENT, A.QUEUED])


def test_end_failed_only_after_a_fallback_and_with_why(sessions: sessionmaker[Session]) -> None:
    notification_id, _ = put(sessions, N.FALLING_BACK, A.FAILED, A.FAILED, fallback_decision="fallback")
    with sessions.begin() as session:
        assert moves.end_failed(session, notification_id=notification_id, error_kind="external_error",
                                detail="30003: Unreachable destination handset", now=NOW)
    notification = notification_of(sessions, notification_id)
    assert (notification.state, notification.error_kind, notification.error_detail) == (
        N.FAILED, "external_error", "30003: Unreachable destination handset")
    read, _ = put(sessions, N.READ, A.READ)
    with sessions.begin() as session:
        assert not moves.end_failed(session, notification_id=read, error_kind="x", detail=None, now=NOW)
    assert states(sessions, read) == (N.READ, [A.READ])


def test_a_host_s_retry_queues_a_failed_notification_again_on_its_route_s_channel(sessions: sessionmaker[Session]) -> None:
    # a notification that failed on its SMS fallback, retried by its host on the platform route
    notification_id, _ = put(sessions, N.FAILED, A.FAILED, A.FAILED, fallback_decision="fallback")
    with sessions.begin() as session:
        session.execute(update(Notification).where(Notification.id == notification_id)
                        .values(channel="sms", error_kind="external_error", error_detail="30003: unreachable",
                                delivery_state="failed"))
        assert moves.retry_failed(session, notification_id=notification_id, route="reminders",
                                  channel="messaging_platform", now=NOW + timedelta(hours=1))
        assert not moves.retry_failed(session, notification_id=notification_id, route="reminders",  # queued now
                                      channel="messaging_platform", now=NOW + timedelta(hours=1))
    retried = notification_of(sessions, notification_id)
    assert (retried.state, retried.current_attempt, retried.channel) == (N.QUEUED, 3, "messaging_platform")
    assert (retried.error_kind, retried.error_detail, retried.fallback_decision) == (None, None, "fallback")
    assert retried.delivery_state is None  # the failed attempt's outcome is not the retry's
    assert retried.send_at is not None and retried.send_at.replace(tzinfo=UTC) == NOW + timedelta(hours=1)
    assert states(sessions, notification_id) == (N.QUEUED, [A.FAILED, A.FAILED, A.QUEUED])
    with sessions() as session:
        third = session.scalars(select(Attempt).where(Attempt.notification_id == notification_id, Attempt.number == 3)).one()
        assert (third.purpose, third.route, third.channel) == ("retry", "reminders", "messaging_platform")


def test_each_move_touches_its_own_notification_only(sessions: sessionmaker[Session]) -> None:
    # two notifications alike: every move names one, and the other is left as it was
    waiting, [waiting_attempt] = put(sessions, N.QUEUED, A.QUEUED)
    bystander, _ = put(sessions, N.QUEUED, A.QUEUED)
    aside, _ = put(sessions, N.QUEUED, A.QUEUED)
    also_aside, _ = put(sessions, N.QUEUED, A.QUEUED)
    with sessions.begin() as session:
        moves.wait_for_workspace(session, notification_id=waiting, attempt_id=None, seen_claims=None,
                                 reason="auth", detail="401", now=NOW)
        for notification_id in (aside, also_aside):
            assert moves.set_aside(session, notification_id=notification_id, detail="died 20 times", now=NOW)
        assert moves.retry_set_aside(session, notification_id=aside, now=NOW)
    assert (notification_of(sessions, waiting).error_kind, notification_of(sessions, bystander).error_kind) == ("auth", None)
    assert (notification_of(sessions, aside).error_kind, notification_of(sessions, also_aside).error_kind) == (
        None, moves.CRASH_LOOP)


def test_an_opt_out_found_by_a_run_never_ends_a_notification_that_ended_meanwhile(sessions: sessionmaker[Session]) -> None:
    # the run read a queued attempt; the host cancelled the notification since (its attempt is queued still)
    notification_id, [attempt_id] = put(sessions, N.CANCELLED, A.QUEUED)
    with sessions.begin() as session:
        moves.end_opted_out(session, notification_id=notification_id, attempt_id=attempt_id, error_kind="opted_out",
                            detail="the recipient opted out", now=NOW, seen_claims=0)
    ended = notification_of(sessions, notification_id)
    assert (ended.state, ended.error_kind, ended.fallback_decision) == (N.CANCELLED, None, None)


LATER = NOW + timedelta(minutes=1)


def _updated_at(sessions: sessionmaker[Session], notification_id: int, attempt_id: int) -> tuple[datetime, datetime]:
    with sessions() as session:
        notification, attempt = session.get(Notification, notification_id), session.get(Attempt, attempt_id)
        assert notification is not None and attempt is not None
        return notification.updated_at, attempt.updated_at


@pytest.mark.parametrize("move, row", [
    ("count_try", "attempt"), ("release", "attempt"), ("mark_unknown", "attempt"), ("re_resolve", "attempt"),
    ("fail_attempt", "attempt"), ("set_aside", "notification"), ("retry_set_aside", "notification"),
    ("end_failed", "notification"),
])
def test_each_move_stamps_the_row_it_changes_with_its_time(sessions: sessionmaker[Session], move: str, row: str) -> None:
    """``updated_at`` is when a reader last saw the row change (the dashboard's, the sweeps' "quiet
    since"): each move writes its own ``now``, not the row's old time, nor the clock's."""
    in_flight = move in ("release", "mark_unknown", "re_resolve", "fail_attempt")
    notification_id, [attempt_id] = put(sessions, N.SENDING if in_flight else N.QUEUED,
                                        A.IN_FLIGHT if in_flight else A.QUEUED, lease_until=LATER if in_flight else None)
    if move == "retry_set_aside":
        with sessions.begin() as session:
            assert moves.set_aside(session, notification_id=notification_id, detail="its task kept dying", now=NOW)
    calls = {
        "count_try": lambda s: moves.count_try(s, attempt_id=attempt_id, now=LATER, max_tries=5) == 2,
        "release": lambda s: moves.release(s, attempt_id=attempt_id, seen_claims=0, now=LATER),
        "mark_unknown": lambda s: moves.mark_unknown(s, attempt_id=attempt_id, seen_claims=0, now=LATER),
        "re_resolve": lambda s: moves.re_resolve(s, attempt_id=attempt_id, seen_claims=0, now=LATER),
        "fail_attempt": lambda s: moves.fail_attempt(s, notification_id=notification_id, attempt_id=attempt_id,
                                                     seen_claims=0, error_kind="rejected", detail="422", now=LATER),
        "set_aside": lambda s: moves.set_aside(s, notification_id=notification_id, detail="its task kept dying",
                                               now=LATER),
        "retry_set_aside": lambda s: moves.retry_set_aside(s, notification_id=notification_id, now=LATER),
        "end_failed": lambda s: moves.end_failed(s, notification_id=notification_id, error_kind="rejected",
                                                 detail="422", now=LATER),
    }
    with sessions.begin() as session:
        assert calls[move](session)
    notification_at, attempt_at = _updated_at(sessions, notification_id, attempt_id)
    assert (notification_at if row == "notification" else attempt_at) == LATER
