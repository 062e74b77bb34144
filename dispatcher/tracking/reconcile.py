"""The tracking sweep (Celery beat): lost deliveries, unconfirmed attempts, delivery deadlines.

1. Webhook deliveries recorded but never processed (their task was lost) are published again, each
   at most once per ``DELIVERY_GRACE_S``, however often the sweep runs while consumers are down.
2. Attempts still unconfirmed (accepted or sent) ``reconcile_after_s`` after their last news are
   read back from the message list, so a dropped webhook never leaves an outcome unknown.
3. First attempts not delivered by their route's ``delivery_deadline_s`` are read back once more,
   then get the single fallback decision, which a delivered message refuses (so a lost
   "delivered" does not cause a needless fallback).
4. A failure recorded by a process that was killed before it made the decision gets it now (the
   next run of its send task or the next delivery of its report make it first, when they come).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from pydantic import ValidationError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from dispatcher import metrics
from dispatcher.context import SendContext, Wait
from dispatcher.enqueue import Enqueuer
from dispatcher.lifecycle import moves, worklists
from dispatcher.policy.breaker import pause_reason
from dispatcher.policy.fallback import Failure
from dispatcher.policy.readback import READ_BACK_STATES
from dispatcher.store import queries as store
from dispatcher.tracking import outcomes as tracking
from dispatcher.tracking.webhooks.deliveries import NewDelivery, record_deliveries, row_of
from dispatcher.tracking.webhooks.events import EventSummary

log = logging.getLogger(__name__)

BATCH = 100
DELIVERY_GRACE_S = 30.0  # a delivery's own task normally runs within this
# A sweep takes its reads back for this long: another sweep skips them meanwhile, and a sweep
# killed halfway leaves them to be read again after it.
READ_HOLD_S = 120.0


@dataclass
class SweepReport:
    republished: int = 0
    reconciled: dict[str, int] = field(default_factory=dict)
    deadline_decisions: dict[str, int] = field(default_factory=dict)
    repaired: int = 0  # failures whose decision a killed process never made


def tracking_sweep(ctx: SendContext, enqueuer: Enqueuer, publish_outcome: Callable[[int], None], *,
                   outcomes_waiting: Callable[[], int | None] = lambda: None) -> SweepReport:
    """One workspace's tracking (``ctx`` is its own: its API, limiter and rows); a deployment with
    several runs it for each. ``outcomes_waiting``: the outcome tasks waiting in the broker's queue
    now (None: it cannot tell), read before the lost deliveries are (a task published after this
    read belongs to a delivery too young to be taken as lost)."""
    report = SweepReport()
    waiting = outcomes_waiting()
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        lost = store.take_lost_deliveries(session, quiet_since=now - timedelta(seconds=DELIVERY_GRACE_S), now=now,
                                          limit=BATCH, workspace=ctx.settings.workspace_name,
                                          queue_holds_tasks=bool(waiting))
    for delivery_row_id in lost:
        publish_outcome(delivery_row_id)
        report.republished += 1
    with ctx.sessions.begin() as session:
        reads = worklists.take_due_reads(session, now=ctx.clock(), limit=BATCH, states=READ_BACK_STATES,
                                         hold_until=ctx.clock() + timedelta(seconds=READ_HOLD_S),
                                         workspace=ctx.settings.workspace_name)
    try:
        report.reconciled = tracking.reconcile_due(reads, ctx, enqueuer)
    except Wait:
        pass  # the shared limiter is paused: the rest waits for the next sweep; deadlines go on
    with ctx.sessions() as session:  # one read of every route's late attempts, then the decisions
        late = [(attempt, route.delivery_deadline_s) for name, route in ctx.settings.routes.items()
                for attempt in worklists.attempts_past_deadline(
                    session, route=name, accepted_before=ctx.clock() - timedelta(seconds=route.delivery_deadline_s),
                    limit=BATCH, workspace=ctx.settings.workspace_name)]
    for attempt, deadline_s in late:
        result = _decide_at_deadline(attempt, deadline_s, ctx, enqueuer)
        report.deadline_decisions[result] = report.deadline_decisions.get(result, 0) + 1
    report.repaired = tracking.repair_undecided_failures(
        ctx, enqueuer, failed_before=ctx.clock() - timedelta(seconds=DELIVERY_GRACE_S), limit=BATCH
    )
    return report


def _decide_at_deadline(attempt: worklists.LateAttempt, deadline_s: float, ctx: SendContext, enqueuer: Enqueuer) -> str:
    """Read the message back once, then decide. A lost delivery report must not bring a fallback to
    someone who has the message, and the scheduled read-backs may come later than the deadline.
    A read that fails puts the decision off to a later sweep, for at most ``reconcile_max_interval_s``
    past the deadline; then the deadline decides on what is known."""
    try:
        read = tracking.reconcile_attempt(attempt.attempt_id, ctx, enqueuer)
    except Wait:
        read = "unreadable"  # not now, by our own limiter
    if read in ("applied_delivered", "applied_read"):
        return "confirmed_by_read"  # its report was lost, or taken for another's; it arrived all the same
    if read == tracking.DELIVERED_BY_EVENTS:
        return "confirmed_by_events"  # updated again after sent without a failure: a late sent overwrote it
    overdue_s = (ctx.clock() - attempt.accepted_at).total_seconds() - deadline_s
    if read == "unreadable" and overdue_s < ctx.settings.reconcile_max_interval_s:
        return "put_off_unreadable"
    return tracking.settle_failure(attempt.notification_id, Failure(purpose=attempt.purpose, late=True), ctx, enqueuer)


def record_and_process(delivery: NewDelivery, ctx: SendContext, enqueuer: Enqueuer) -> str:
    """A verified delivery the receiver could not record (its store was away), handed over whole:
    record it now, as the receiver would have (once, by its delivery ID), and apply it. Run again
    (a wait, a store still away), it finds its row and goes on from there."""
    [row_id] = record_deliveries(ctx.sessions, [delivery])
    if row_id is None:  # recorded by an earlier run of this task, or by the receiver after all
        row_id = row_of(ctx.sessions, delivery.delivery_id)
    return "missing" if row_id is None else process_delivery(row_id, ctx, enqueuer)


def process_delivery(delivery_row_id: int, ctx: SendContext, enqueuer: Enqueuer) -> str:
    """The outcome consumer's work for one recorded webhook delivery (at least once, idempotent).

    Each run counts a try on the row, but for a keyword reply's run that failed because the
    workspace was away (a refused token, no connection), which gives it back. A run that fails keeps the error's kind on the row and
    raises (a Wait is retried soon by the task; anything else waits for the tracking sweep to
    publish the row again); past ``delivery_max_tries`` the delivery is set aside, with its reason,
    and never tried again: no single event can stop the consumer. Reconciliation still reads the
    message's state back, so setting a delivery aside loses no outcome.
    """
    with ctx.sessions.begin() as session:
        # one guarded statement each (count the run; set the row aside): no transaction block on PostgreSQL
        moves.each_statement_alone(session)
        run = store.start_delivery_run(session, delivery_row_id)
        if run is None:
            return "already_processed" if store.load_delivery(session, delivery_row_id) is not None else "missing"
        if run.tries > ctx.settings.delivery_max_tries:
            store.mark_delivery_processed(session, delivery_row_id, outcome=store.SET_ASIDE, now=ctx.clock())
    return _process_run(delivery_row_id, run, ctx, enqueuer)


def _process_run(delivery_row_id: int, run: store.DeliveryRun, ctx: SendContext, enqueuer: Enqueuer) -> str:
    """:func:`process_delivery` once its run is counted (and, past the bound, the row set aside)."""
    if run.tries > ctx.settings.delivery_max_tries:
        log.warning("webhook delivery %s set aside after %d tries (last error: %s)", delivery_row_id, run.tries - 1,
                    run.last_error or "unknown")
        metrics.OUTCOMES.labels(result="set_aside").inc()
        return "set_aside"
    raw_summary, received_at = run.summary, run.received_at
    # Back to the typed record the receiver stored, so times are datetimes again, not JSON strings.
    try:
        summary: EventSummary | None = EventSummary.model_validate(raw_summary)
    except ValidationError:
        summary = None  # not written by this version's receiver: retrying cannot make it readable
    marked: list[str] = []

    def mark_processed(session: Session, outcome: str) -> None:
        """Inside the transaction that applies the delivery's own outcome: both or neither."""
        store.mark_delivery_processed(session, delivery_row_id, outcome=outcome, now=ctx.clock())
        marked.append(outcome)

    try:
        outcome = (tracking.apply_event(summary, ctx, enqueuer, received_at=received_at, mark_processed=mark_processed)
                   if summary is not None else "ignored_unreadable")
    except Wait:
        # Not now (a read's coalescing wait, the reads' share of the limiter): tried again after the
        # wait, its try given back, so that waiting never sets a delivery aside. Bounded all the same:
        # a coalescing wait ends with a read, and the reads' share frees a slot within a minute.
        with contextlib.suppress(Exception), ctx.sessions.begin() as session:
            store.note_delivery_error(session, delivery_row_id, error="Wait", spent_try=False)
        raise
    except Exception as error:
        # A STOP or START reply that failed because the workspace was away (a refused token, no
        # connection) gives its try back and waits for the workspace: it needs the inbox list (the
        # routes are named by their inboxes), and set aside, the opt-out would be lost (the outage
        # world of the simulation, seed 14). That list is the account's, so only a workspace that
        # refuses everyone keeps it waiting. Any other delivery spends its try as before: the
        # message's state is read back by reconciliation, so setting it aside loses nothing.
        waits = summary is not None and summary.reply_keyword is not None and pause_reason(error) is not None
        with contextlib.suppress(Exception), ctx.sessions.begin() as session:  # a store that is down keeps nothing
            store.note_delivery_error(session, delivery_row_id, error=type(error).__name__, spent_try=not waits)
        raise
    metrics.OUTCOMES.labels(result=outcome).inc()
    if not marked:
        with ctx.sessions.begin() as session:
            store.mark_delivery_processed(session, delivery_row_id, outcome=outcome, now=ctx.clock())
    return outcome


@dataclass
class BatchResult:
    """What one consumer task of several deliveries did: each delivery's outcome word, and the
    deliveries it is to run again after ``wait_s`` (events without a status, waiting a moment so
    that one read answers them together; or the workspace's limiter)."""

    ended: dict[int, str] = field(default_factory=dict)  # by delivery row ID
    waiting: list[int] = field(default_factory=list)
    wait_s: float = 0.0

    @property
    def words(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for word in self.ended.values():
            counts[word] = counts.get(word, 0) + 1
        return counts


def process_deliveries(delivery_row_ids: Sequence[int], ctx: SendContext, enqueuer: Enqueuer) -> BatchResult:
    """The outcome consumer's work for several recorded deliveries (one task for a group commit of
    the receiver's): each delivery as :func:`process_delivery` treats it, with what that allows.

    One statement counts a run on each. The deliveries that carry a status (the contract's shape;
    nothing to read first) are applied together, in ONE transaction that also marks them processed;
    a failure among them gets its decision after it, in transactions of its own, as alone. The
    others (no status, incoming messages, rows past their tries or unreadable) go the single path
    one after the other. If applying them together fails, each is applied alone, so that one bad
    delivery costs the others nothing but the time. A database that does not answer raises (the
    task runs them all again: a processed delivery is skipped)."""
    result = BatchResult()
    with ctx.sessions.begin() as session:
        moves.each_statement_alone(session)  # as process_delivery: one guarded statement each
        runs = store.start_delivery_runs(session, list(delivery_row_ids))
        for row_id, run in runs.items():
            if run.tries > ctx.settings.delivery_max_tries:
                store.mark_delivery_processed(session, row_id, outcome=store.SET_ASIDE, now=ctx.clock())
    for row_id in delivery_row_ids:
        if row_id not in runs:
            result.ended[row_id] = "already_processed"
    together = {row_id: outcome for row_id, run in runs.items() if (outcome := _applies_at_once(run, ctx)) is not None}
    alone = [row_id for row_id in runs if row_id not in together]
    if together and not _apply_together(together, ctx, enqueuer, result):
        alone = list(runs)
    for row_id in alone:
        try:
            result.ended[row_id] = _process_run(row_id, runs[row_id], ctx, enqueuer)
        except Wait as wait:
            result.waiting.append(row_id)
            result.wait_s = max(result.wait_s, wait.delay_s)
        except (OperationalError, InterfaceError):
            raise
        except Exception as error:  # kept on the row by _process_run; the tracking sweep publishes it again
            log.warning("webhook delivery %s: %s; left for the tracking sweep", row_id, type(error).__name__)
    return result


def _applies_at_once(run: store.DeliveryRun, ctx: SendContext) -> tracking.Outcome | None:
    """The outcome a delivery announces, when it can be applied with others: it carries a status
    about a message (no read needed first), is not a customer's message, and has tries left."""
    if run.tries > ctx.settings.delivery_max_tries:
        return None
    try:
        summary = EventSummary.model_validate(run.summary)
    except ValidationError:
        return None
    if summary.status is None or summary.message_id is None or summary.event not in ("message_created", "message_updated"):
        return None
    if summary.event == "message_created" and summary.message_type == "incoming":
        return None
    return tracking.Outcome(summary.message_id, summary.status, summary.external_error, summary.clean_update)


def _apply_together(outcomes: dict[int, tracking.Outcome], ctx: SendContext, enqueuer: Enqueuer,
                    result: BatchResult) -> bool:
    """Apply ``outcomes`` (by delivery row) in one transaction; then the decisions that follow
    failures, each delivery marked processed once its decision is made. False: the transaction
    failed and nothing of it was kept."""
    following: dict[int, tracking.Applied] = {}
    done: dict[int, str] = {}
    try:
        with ctx.sessions.begin() as session:
            # By message: the attempts are locked (PostgreSQL) in that order by every task, so two
            # tasks holding reports of the same messages wait for each other, never deadlock; and a
            # message's reports apply in the order they were recorded.
            ordered = sorted(outcomes.items(), key=lambda item: (item[1].message_id, item[0]))
            group = tracking.read_group(session, [outcome for _, outcome in ordered], ctx)
            for row_id, outcome in ordered:
                applied = tracking.apply_in(session, outcome, ctx, group)
                if applied.failed is not None or applied.word == "duplicate_status":
                    following[row_id] = applied  # a decision may follow: marked once it is made
                else:
                    done[row_id] = applied.word
            tracking.finish_group(session, group, ctx)
            store.mark_deliveries_processed(session, done, now=ctx.clock())
        tracking.observe_deliveries(group)
    except (OperationalError, InterfaceError):
        raise
    except Exception as error:
        log.warning("applying %d webhook deliveries together failed (%s); each is applied alone", len(outcomes),
                    type(error).__name__)
        return False
    for row_id, applied in following.items():
        try:
            word = tracking.follow_up(outcomes[row_id], applied, ctx, enqueuer)
            with ctx.sessions.begin() as session:
                store.mark_delivery_processed(session, row_id, outcome=word, now=ctx.clock())
        except (OperationalError, InterfaceError):
            raise
        except Exception as error:
            with contextlib.suppress(Exception), ctx.sessions.begin() as session:
                store.note_delivery_error(session, row_id, error=type(error).__name__)
            log.warning("webhook delivery %s: %s; left for the tracking sweep", row_id, type(error).__name__)
            continue
        done[row_id] = word
    for row_id, word in done.items():
        result.ended[row_id] = word
        metrics.OUTCOMES.labels(result=word).inc()
    return True
