"""Random interleavings of the lifecycle's moves, against PostgreSQL, with the promises checked after every step.

A Hypothesis state machine plays two send workers (claims, releases, unknown outcomes,
acceptances and failures, each with its own lease clock), the outcome consumer (delivery reports in
any order, duplicates included), the sweeps (due releases, deadline decisions) and the decisions
that follow failures, on one notification at a time. After every step it checks what the
lifecycle promises:

* at most one accepted message per attempt, and an accepted message never changes;
* at most one fallback decision per notification, and at most two attempts;
* states only move forward: an attempt that was accepted never goes back to sending, a delivery
  state never drops, and nothing leaves ``failed`` or ``read``;
* every notification that ended ``failed`` has an ``error_kind`` and an ``error_detail``;
* a worker claims an attempt only if no other claim was won since it read the attempt (and looked
  for its message), so a message that another claim's call may have sent is never sent again;
* a deadline decision is never made for a message that is delivered.

A failing run prints its steps, and ``@reproduce_failure`` replays it exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.lifecycle import moves
from dispatcher.lifecycle.states import ACCEPTED_ATTEMPT_STATES, AttemptPurpose, AttemptState, NotificationState, rank
from dispatcher.store.db import make_engine, session_factory
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Attempt, Notification

pytestmark = pytest.mark.integration

START = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
EVENTS = itertools.count(1)
MESSAGES = itertools.count(1000)
REPORTS = st.sampled_from([AttemptState.SENT, AttemptState.DELIVERED, AttemptState.READ, AttemptState.FAILED])
WORKERS = st.sampled_from([0, 1])
SEND_FAILURES = st.sampled_from(["tries_exhausted", "not_contactable", "not_found", "auth"])


class Lifecycle(RuleBasedStateMachine):
    sessions: sessionmaker[Session]

    def __init__(self) -> None:
        super().__init__()
        self.now = START
        self.notification_id = 0
        self.seen_messages: dict[int, int] = {}  # attempt ID -> its message ID, once accepted
        self.decisions: list[str] = []
        self.resends = 0
        self.history: list[tuple[str, list[str]]] = []
        self.read_by: dict[int, tuple[int, int, int]] = {}  # worker -> (attempt, its claims, claims won) as read
        self.claims_won: dict[int, int] = {}  # attempt -> its won claims, counted by the model itself
        self.cancelled_with: set[int] | None = None  # the messages it had when the host's cancel won

    # -- set-up ---------------------------------------------------------------------------------
    @initialize(scheduled=st.booleans(), fallback_route=st.booleans())
    def hand_over(self, scheduled: bool, fallback_route: bool) -> None:
        with self.sessions.begin() as session:
            notification = moves.new_notification(
                send_at=START if scheduled else None, event_id=f"interleaving-{next(EVENTS)}", fingerprint="f" * 64,
                route="reminders", fallback_route="sms" if fallback_route else None, created_at=START, updated_at=START)
            session.add(notification)
            session.flush()
            self.notification_id = notification.id

    # -- reading --------------------------------------------------------------------------------
    def _rows(self, session: Session) -> tuple[Notification, list[Attempt]]:
        notification = session.get(Notification, self.notification_id, populate_existing=True)
        assert notification is not None
        attempts = list(session.scalars(select(Attempt).where(Attempt.notification_id == self.notification_id)
                                        .order_by(Attempt.number).execution_options(populate_existing=True)))
        return notification, attempts

    def _current(self, session: Session) -> tuple[Notification, Attempt | None]:
        notification, attempts = self._rows(session)
        return notification, next((a for a in attempts if a.number == notification.current_attempt), None)

    # -- the sweeps -----------------------------------------------------------------------------
    @rule(seconds=st.integers(0, 40))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def sweep_releases_what_is_due(self) -> None:
        with self.sessions.begin() as session:
            moves.release_due(session, [self.notification_id], now=self.now)

    # -- a send worker ----------------------------------------------------------------------------
    @rule()
    def a_worker_opens_the_current_attempt(self) -> None:
        with self.sessions.begin() as session:
            notification, _ = self._current(session)
            if notification.state in (NotificationState.QUEUED, NotificationState.SENDING, NotificationState.FALLING_BACK):
                moves.open_attempt(session, notification_id=self.notification_id, number=notification.current_attempt,
                                   route="r", channel="c",
                                   now=self.now, columns=(Attempt.__table__.c.id,))

    @rule(worker=WORKERS)
    def a_worker_reads_the_attempt_and_looks_for_its_message(self, worker: int) -> None:
        with self.sessions() as session:
            _, attempt = self._current(session)
            if attempt is not None:
                # what the worker read, and how many claims it has seen (its look covers their messages)
                self.read_by[worker] = (attempt.id, attempt.claims, self.claims_won.get(attempt.id, 0))

    @rule(worker=WORKERS)
    def a_worker_claims(self, worker: int) -> None:
        if worker not in self.read_by:
            return
        attempt_id, seen_claims, claims_seen = self.read_by.pop(worker)
        with self.sessions.begin() as session:
            _, attempt = self._current(session)
            if attempt is None or attempt.id != attempt_id:
                return
            target = moves.Target(inbox_id=1, contact_id=2, conversation_id=3, channel="c", content_hash="h")
            if moves.claim(session, notification_id=self.notification_id, attempt_id=attempt.id,
                           fallback=attempt.purpose == AttemptPurpose.FALLBACK, target=target, now=self.now,
                           lease_until=self.now + LEASE, seen_claims=seen_claims):
                # no claim was won between this worker's read (and look) and its own claim: any
                # message another claim's call may have sent was there to be found
                assert self.claims_won.get(attempt_id, 0) == claims_seen, (self.claims_won, claims_seen)
                self.claims_won[attempt_id] = claims_seen + 1

    @rule(ambiguous=st.booleans())
    def a_worker_s_call_ends_without_a_message(self, ambiguous: bool) -> None:
        with self.sessions.begin() as session:
            _, attempt = self._current(session)
            if attempt is not None:
                if ambiguous:
                    moves.mark_unknown(session, attempt_id=attempt.id, seen_claims=attempt.claims, now=self.now)
                else:
                    moves.release(session, attempt_id=attempt.id, seen_claims=attempt.claims, now=self.now)

    @rule(status=st.sampled_from([AttemptState.ACCEPTED, AttemptState.SENT, AttemptState.DELIVERED]))
    def a_worker_records_the_acceptance(self, status: AttemptState) -> None:
        with self.sessions.begin() as session:
            _, attempt = self._current(session)
            if attempt is not None:
                moves.accept(session, notification_id=self.notification_id, attempt_id=attempt.id,
                             message_id=next(MESSAGES), state=status, now=self.now, next_read_at=None)

    @rule(kind=SEND_FAILURES)
    def a_worker_gives_up(self, kind: str) -> None:
        with self.sessions.begin() as session:
            _, attempt = self._current(session)
            if attempt is not None and moves.fail_attempt(session, notification_id=self.notification_id,
                                                          attempt_id=attempt.id, seen_claims=attempt.claims,
                                                          error_kind=kind, detail=f"{kind} here",
                                                          now=self.now):
                self._decide_or_end(session, attempt.purpose, kind, f"{kind} here")

    # -- the outcome consumer -----------------------------------------------------------------------
    @rule(report=REPORTS, number=st.sampled_from([1, 2, 3]))
    def the_consumer_applies_a_report(self, report: AttemptState, number: int) -> None:
        with self.sessions.begin() as session:
            _, attempts = self._rows(session)
            attempt = next((a for a in attempts if a.number == number), None)
            if attempt is None:
                return
            current = AttemptState(attempt.state)
            if moves.record_outcome(session, notification_id=self.notification_id, attempt_id=attempt.id,
                                    attempt_number=number, current=current, new=report,
                                    external_error="131026: Message undeliverable", now=self.now) \
                    and report is AttemptState.FAILED:
                self._decide_or_end(session, attempt.purpose, "external_error", "131026: Message undeliverable")

    @rule()
    def the_consumer_resends_as_template_after_131047(self) -> None:
        with self.sessions.begin() as session:
            notification, attempt = self._current(session)
            if attempt is not None and attempt.state == AttemptState.FAILED and attempt.purpose == AttemptPurpose.FIRST:
                if moves.resend_as_template(session, notification_id=self.notification_id, failed_number=attempt.number,
                                            route="r", channel="c", now=self.now):
                    self.resends += 1

    @rule(fall_back=st.booleans())
    def the_deadline_sweep_decides(self, fall_back: bool) -> None:
        with self.sessions.begin() as session:
            notification, attempt = self._current(session)
            if attempt is None or attempt.purpose == AttemptPurpose.FALLBACK:
                return  # the deadline sweep looks at first sends only
            # No look at the attempt's state first: the sweep's query ran in an earlier transaction,
            # and a report may have landed since. The move itself must refuse what was delivered.
            decision = moves.FallbackDecision(
                fall_back=fall_back and notification.fallback_route is not None, reason="not delivered by the deadline",
                failed=False, fallback_route="sms", fallback_channel="sms")
            if moves.decide_fallback(session, notification_id=self.notification_id, decision=decision, now=self.now):
                assert attempt.state in (AttemptState.ACCEPTED, AttemptState.SENT), attempt.state
                self.decisions.append("deadline")

    # -- the host --------------------------------------------------------------------------------
    @rule()
    def the_host_cancels(self) -> None:
        try:
            with self.sessions.begin() as session:
                notification, attempts = self._rows(session)
                if moves.cancel(session, notification_id=self.notification_id, number=notification.current_attempt,
                                route="r", channel="c", detail="cancelled by the host", now=self.now):
                    self.cancelled_with = {a.message_id for a in attempts if a.message_id is not None}
        except moves.CancelLost:
            pass  # the notification had moved: nothing was kept

    def _decide_or_end(self, session: Session, purpose: str, kind: str, detail: str) -> None:
        if purpose == AttemptPurpose.FALLBACK:
            moves.end_failed(session, notification_id=self.notification_id, error_kind=kind, detail=detail, now=self.now)
            return
        notification, _ = self._rows(session)
        decision = moves.FallbackDecision(
            fall_back=notification.fallback_route is not None, reason=kind, failed=True, error_kind=kind,
            error_detail=detail, fallback_route="sms", fallback_channel="sms")
        if moves.decide_fallback(session, notification_id=self.notification_id, decision=decision, now=self.now):
            self.decisions.append(kind)

    # -- the promises ------------------------------------------------------------------------------
    @invariant()
    def the_promises_hold(self) -> None:
        if not self.notification_id:
            return
        with self.sessions() as session:
            notification, attempts = self._rows(session)
        states = [attempt.state for attempt in attempts]
        assert len(attempts) <= 3
        assert len(self.decisions) <= 1, self.decisions
        assert (notification.fallback_decision is None) == (not self.decisions)
        assert self.resends <= 1
        purposes = [attempt.purpose for attempt in attempts]
        assert len(purposes) == len(set(purposes)) and [a.number for a in attempts] == list(range(1, len(attempts) + 1))
        assert (AttemptPurpose.FALLBACK in purposes) == (notification.fallback_decision == "fallback")
        assert notification.current_attempt == max((a.number for a in attempts), default=1)
        for attempt in attempts:
            if attempt.message_id is not None:  # one accepted message, never replaced
                assert self.seen_messages.setdefault(attempt.id, attempt.message_id) == attempt.message_id
            if attempt.id in self.seen_messages:
                assert AttemptState(attempt.state) in ACCEPTED_ATTEMPT_STATES | {AttemptState.FAILED}
        if self.history:
            before_state, before_attempts = self.history[-1]
            assert before_state not in (NotificationState.FAILED, NotificationState.READ, NotificationState.CANCELLED) \
                or notification.state == before_state
            for old, new in zip(before_attempts, states, strict=False):
                assert old not in (AttemptState.FAILED, AttemptState.READ) or new == old
                if AttemptState(old) in ACCEPTED_ATTEMPT_STATES:
                    assert rank(AttemptState(new)) >= rank(AttemptState(old)), (old, new)
        if notification.state == NotificationState.FAILED:
            assert notification.error_kind and notification.error_detail, "an ended notification says why"
        if self.cancelled_with is not None:  # once cancelled: cancelled for good, and no message after it
            assert notification.state == NotificationState.CANCELLED
            assert {a.message_id for a in attempts if a.message_id is not None} == self.cancelled_with
        self.history.append((notification.state, states))


@pytest.fixture(scope="module")
def postgres_sessions(postgres_url: str) -> Iterator[sessionmaker[Session]]:
    upgrade_database(postgres_url)
    engine = make_engine(postgres_url)
    try:
        yield session_factory(engine)
    finally:
        engine.dispose()


def test_every_interleaving_keeps_the_promises(postgres_sessions: sessionmaker[Session]) -> None:
    Lifecycle.sessions = postgres_sessions
    machine = settings(max_examples=60, stateful_step_count=30, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow])(Lifecycle)
    machine.TestCase().runTest()


def _orders(first: list[str], second: list[str]) -> Iterator[list[tuple[int, str]]]:
    """Every interleaving of two workers' steps, each worker's own steps kept in order."""
    for positions in itertools.combinations(range(len(first) + len(second)), len(first)):
        steps, left, right = [], iter(first), iter(second)
        for index in range(len(first) + len(second)):
            steps.append((0, next(left)) if index in positions else (1, next(right)))
        yield steps


@pytest.mark.parametrize("start", [AttemptState.QUEUED, AttemptState.UNKNOWN])
def test_every_order_of_two_workers_that_read_claim_and_lose_the_answer(
    postgres_sessions: sessionmaker[Session], start: AttemptState
) -> None:
    """Checked, not sampled: all 20 orders of two workers each reading the attempt (and looking
    for an earlier message), claiming it, and losing createMessage's answer. A claim may only be
    won by a worker that read the attempt after the last won claim: otherwise its look could not
    have seen the message the other claim's call may have sent."""
    program = ["read", "claim", "answer_lost"]
    orders = list(_orders(program, program))
    assert len(orders) == 20
    target = moves.Target(inbox_id=1, contact_id=2, conversation_id=3, channel="c", content_hash="h")
    for order in orders:
        with postgres_sessions.begin() as session:
            notification = moves.new_notification(
                send_at=None, event_id=f"two-workers-{next(EVENTS)}", fingerprint="f" * 64, route="reminders",
                fallback_route="sms", created_at=START, updated_at=START)
            session.add(notification)
            session.flush()
            attempt = Attempt(notification_id=notification.id, number=1, route="r", channel="c", state=start, tries=1,
                              in_flight_since=START if start is AttemptState.UNKNOWN else None,
                              claims=1 if start is AttemptState.UNKNOWN else 0)
            session.add(attempt)
            session.flush()
            notification_id, attempt_id = notification.id, attempt.id
        claims_won, read_at, won = 0, {}, {0: False, 1: False}
        for worker, step in order:
            with postgres_sessions.begin() as session:
                if step == "read":
                    row = session.get(Attempt, attempt_id, populate_existing=True)
                    assert row is not None
                    read_at[worker] = (row.claims, claims_won)
                elif step == "claim":
                    seen_claims, seen_won = read_at[worker]
                    won[worker] = moves.claim(session, notification_id=notification_id, attempt_id=attempt_id,
                                              fallback=False, target=target, now=START, lease_until=START + LEASE,
                                              seen_claims=seen_claims)
                    if won[worker]:
                        assert claims_won == seen_won, f"a stale claim won in the order {order}"
                        claims_won += 1
                elif won[worker]:  # its answer is lost: it holds the claim it won (the one after what it read)
                    assert moves.mark_unknown(session, attempt_id=attempt_id, seen_claims=read_at[worker][0] + 1, now=START)
        assert claims_won >= 1, f"nobody could claim in the order {order}"


@pytest.mark.parametrize("scheduled", [False, True])
def test_every_order_of_a_cancel_and_a_worker_that_opens_reads_claims_and_sends(
    postgres_sessions: sessionmaker[Session], scheduled: bool
) -> None:
    """Checked, not sampled: the host's cancel at each of the five places among a worker's steps
    (release when scheduled, open the attempt, read it, claim it, record its message). A cancel
    that answered cancelled is followed by no claim and no message; one that came after the claim
    answers too late and changes nothing. (A first-draft cancel of the notification's row alone
    fails the orders where it falls between the worker's read and its claim.)"""
    worker = (["release"] if scheduled else []) + ["open", "read", "claim", "send"]
    orders = list(_orders(worker, ["cancel"]))
    assert len(orders) == len(worker) + 1
    target = moves.Target(inbox_id=1, contact_id=2, conversation_id=3, channel="c", content_hash="h")
    for order in orders:
        with postgres_sessions.begin() as session:
            notification = moves.new_notification(
                send_at=START if scheduled else None, event_id=f"cancel-order-{next(EVENTS)}", fingerprint="f" * 64,
                route="reminders", fallback_route="sms", created_at=START, updated_at=START)
            session.add(notification)
            session.flush()
            notification_id = notification.id
        cancelled, claimed, sent, seen = False, False, False, None
        for _, step in order:
            with postgres_sessions.begin() as session:
                if step == "release":
                    moves.release_due(session, [notification_id], now=START)
                elif step == "open":
                    row = session.get(Notification, notification_id, populate_existing=True)
                    assert row is not None
                    if row.state == NotificationState.QUEUED:
                        moves.open_attempt(session, notification_id=notification_id, number=1, route="r", channel="c",
                                           now=START, columns=(Attempt.__table__.c.id,))
                elif step == "read":
                    seen = session.scalars(select(Attempt).where(Attempt.notification_id == notification_id)
                                           .execution_options(populate_existing=True)).one_or_none()
                    seen = (seen.id, seen.claims) if seen is not None else None
                elif step == "claim" and seen is not None:
                    claimed = moves.claim(session, notification_id=notification_id, attempt_id=seen[0], fallback=False,
                                          target=target, now=START, lease_until=START + LEASE, seen_claims=seen[1])
                elif step == "send" and claimed:
                    sent = moves.accept(session, notification_id=notification_id, attempt_id=seen[0] if seen else 0,
                                        message_id=next(MESSAGES), state=AttemptState.SENT, now=START,
                                        next_read_at=None) is not None
                elif step == "cancel":
                    try:
                        cancelled = moves.cancel(session, notification_id=notification_id, number=1, route="r",
                                                 channel="c", detail="cancelled by the host", now=START)
                    except moves.CancelLost:
                        cancelled = False
        with postgres_sessions() as session:
            final = session.get(Notification, notification_id)
            assert final is not None
        steps = [step for _, step in order]
        if cancelled:
            assert not claimed and not sent and final.state == NotificationState.CANCELLED, steps
        else:
            assert steps.index("cancel") > steps.index("claim") and claimed and sent, steps
            assert final.state == NotificationState.SENT, steps
