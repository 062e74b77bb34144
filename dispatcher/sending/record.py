"""Record: what a run's end means, written as lifecycle moves. An accepted or adopted message, a
failure (and the single decision that follows it, :func:`dispatcher.tracking.outcomes.settle_failure`),
a retry, a wait for the workspace or for quiet hours, a release of the claim."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from dispatcher import metrics
from dispatcher.api import ApiError, Message, NotFound
from dispatcher.api.errors import ApiStatusError, ServerError
from dispatcher.context import SendContext, Wait, pause_after_429, readback_plan_of
from dispatcher.lifecycle import moves
from dispatcher.lifecycle.states import (
    SENDABLE_NOTIFICATION_STATES,
    AttemptPurpose,
    AttemptState,
    attempt_state_from_status,
)
from dispatcher.policy.backoff import backoff_s
from dispatcher.policy.breaker import Pause
from dispatcher.policy.channels import reports_read
from dispatcher.policy.fallback import OUTCOME_UNKNOWN, SEND_DEADLINE, WINDOW_PAST_DEADLINE, Failure
from dispatcher.policy.readback import next_read_at
from dispatcher.policy.retry import Decision, DecisionKind, decide
from dispatcher.recipients.keys import contact_keys
from dispatcher.sending import call, prepare
from dispatcher.sending.job import TRIES_EXHAUSTED, Outcome, SendJob, SendResult, current_attempt
from dispatcher.store import queries as store
from dispatcher.tracking import outcomes as tracking

log = logging.getLogger(__name__)


def end_run(job: SendJob, ctx: SendContext) -> None:
    """The run ends without dying (it waits, retries later, or found nothing to do): it is not
    counted as a crash. Only runs that never get here (a killed process, a bug that kills it)
    stay counted, toward ``send_max_runs``."""
    with ctx.sessions.begin() as session:
        moves.end_run(session, attempt_id=job.attempt_id)


def make_owed_decision(notification_id: int, number: int, ctx: SendContext) -> SendResult:
    """The current attempt failed and its notification is still to be sent, so the failure's
    decision is owed: the run that recorded the failure died before it (or is making it now).
    Made here, not by the sweep; it calls nothing, so a paused workspace does not hold it up."""
    owed = tracking.finish_owed_decision(notification_id, ctx, ctx.enqueuer)
    return SendResult(Outcome.SKIPPED, f"attempt {number} is failed" + (f"; its owed decision made now: {owed}" if owed else ""))


def decide_after(error: ApiError, job: SendJob, ctx: SendContext) -> Decision:
    """The retry policy's decision after a call of this run's failed. A call that reached the
    workspace (answered, refused, timed out) spends one provider try, counted before the decision
    is applied; a refused token or no connection pauses every worker and spends none."""
    note_answer(error, job.notification_id, ctx)
    decision = decide(error, tries=job.tries + 1, plan=ctx.plan, rng=ctx.rng)
    if decision.kind is not DecisionKind.PAUSE_WORKSPACE:
        with ctx.sessions.begin() as session:
            moves.count_try(session, attempt_id=job.attempt_id, now=ctx.clock(), max_tries=ctx.plan.max_tries)
    return decision


def waited(wait: Wait, job: SendJob, ctx: SendContext) -> SendResult:
    """No call was made (our limiter said not now, or another worker is making the conversation):
    no try is spent. Past the send deadline the notification stops waiting and fails, saying so,
    so a wait that never ends cannot keep it open."""
    if prepare.past_send_deadline(job, ctx.settings, now=ctx.clock()):
        return fail(job, ctx, SEND_DEADLINE, f"past the send deadline, still waiting: {wait.reason}")
    return SendResult(Outcome.RETRY, wait.reason, delay_s=wait.delay_s)


def pause_workspace(decision: Decision, notification_id: int, held: SendJob | None, ctx: SendContext) -> SendResult:
    """The policy said: the workspace refuses our token or cannot be reached. Trip the breaker for
    every worker, and wait (not fail). ``held``: the run's job, when its attempt goes back to queued."""
    pause, opened = ctx.breaker.trip(decision.error_kind, decision.reason)
    if opened:  # one line per pause, not one per notification
        log.warning("workspace paused for every worker: %s; trying again in %.0f s",
                    pause.reason, max(pause.until - time.time(), 0.0))
        metrics.WORKSPACE_PAUSES.labels(reason=pause.reason).inc()
    return wait_for_workspace(notification_id, held, pause, ctx)


def note_answer(error: ApiError, notification_id: int, ctx: SendContext) -> None:
    """A 5xx puts the notification in the workspace's streak of them (at the breaker's threshold of
    notifications every worker pauses: it is down, docs/priorities.md); any other answer ends the
    streak. This run's own decision stays the retry policy's (a retry, or a look before any resend)."""
    if isinstance(error, ServerError):
        tripped = ctx.breaker.server_error(notification_id)
        if tripped is not None and tripped[1]:  # one line per pause, not one per notification
            pause = tripped[0]
            log.warning("workspace paused for every worker: %s; trying again in %.0f s", pause.reason,
                        max(pause.until - time.time(), 0.0))
            metrics.WORKSPACE_PAUSES.labels(reason=pause.reason).inc()
    elif isinstance(error, ApiStatusError):
        ctx.breaker.answered()


def breaker_closed(ctx: SendContext) -> None:
    if ctx.breaker.close():
        log.warning("workspace answers again: every worker goes on sending")


def wait_for_workspace(notification_id: int, held: SendJob | None, pause: Pause, ctx: SendContext) -> SendResult:
    """Record why the notification waits and hand it back for when the pause ends; past its send
    deadline it fails with that reason instead (nothing is lost before then). A notification whose
    current attempt has failed waits for nothing: its owed decision needs no call, and it keeps the
    reason it failed with (never "the workspace is away": the redeliveries world, seed 8, showed
    a 404 ended as unreachable)."""
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        row = store.load_for_send(session, notification_id)
        if row is None or row.state not in SENDABLE_NOTIFICATION_STATES:
            return SendResult(Outcome.SKIPPED, "nothing to send")
        owed = row.attempt_state == AttemptState.FAILED
        if not owed and not prepare.past_deadline(row.created_at, row.send_at, now=now, deadline_s=ctx.settings.send_deadline_s):
            moves.wait_for_workspace(session, notification_id=notification_id,
                                     attempt_id=held.attempt_id if held else None,
                                     seen_claims=held.claims if held else None,
                                     reason=pause.reason, detail=pause.detail, now=now)
            wait_s = max(pause.until - time.time(), 1.0)
            return SendResult(Outcome.RETRY, f"workspace paused ({pause.reason})", delay_s=wait_s, deferred=True,
                              paused=True)
        failed = None if owed else _fail_past_deadline(session, row, held, pause, ctx, now=now)
    if failed is None:
        return make_owed_decision(notification_id, row.current_attempt, ctx)
    if failed.moved:
        tracking.settle_failure(notification_id, Failure(purpose=failed.purpose, error_kind=failed.error_kind,
                                                         detail=failed.detail), ctx, ctx.enqueuer)
    return SendResult(Outcome.FAILED, f"{failed.error_kind}: past the send deadline", paused=True)


@dataclass(frozen=True)
class _DeadlineFailure:
    """How the current attempt ended past the send deadline, and whether this run ended it."""

    error_kind: str
    detail: str
    moved: bool
    purpose: AttemptPurpose


def _fail_past_deadline(session: Session, row: Any, held: SendJob | None, pause: Pause, ctx: SendContext, *,
                        now: datetime) -> _DeadlineFailure:
    """The workspace stayed away past the send deadline: the current attempt fails with the pause's reason."""
    number, route_name, purpose = current_attempt(row)
    route = ctx.settings.routes.get(route_name)
    attempt = moves.open_attempt(session, notification_id=row.id, number=number, route=route_name,
                                 channel=route.channel.value if route else "unknown", now=now)
    error_kind, detail = pause.reason, f"past the send deadline: {pause.detail}"
    if attempt.state in (AttemptState.IN_FLIGHT, AttemptState.UNKNOWN):
        # A run that claimed it died, or lost createMessage's answer: its message may exist, and
        # the look for it is what the workspace's absence prevents. Ended as unknown, never a
        # fallback (the outage world of the simulation, seed 30: a failed record and a fallback
        # for a message the person had).
        error_kind = OUTCOME_UNKNOWN
        detail = f"an earlier try may have sent it and the workspace was away past the send deadline: {pause.detail}"
    moved = moves.fail_attempt(session, notification_id=row.id, attempt_id=attempt.id,
                               seen_claims=held.claims if held and held.attempt_id == attempt.id else None,
                               error_kind=error_kind, detail=detail, now=now)
    return _DeadlineFailure(error_kind, detail, moved, purpose)


def pause_before_job(error: ApiError, notification_id: int, ctx: SendContext) -> SendResult | None:
    """The inbox list failed before the run took its attempt: only a reason to pause every
    worker (a refused token, no connection) stops the run here; a 429 also pauses the limiter."""
    note_answer(error, notification_id, ctx)
    decision = decide(error, tries=1, plan=ctx.plan, rng=ctx.rng)
    if decision.kind is DecisionKind.PAUSE_WORKSPACE:
        return pause_workspace(decision, notification_id, None, ctx)
    if decision.pause_s > 0:
        pause_after_429(ctx.limiter, decision.pause_s)
    return None


def outside_window(job: SendJob, ctx: SendContext, opening: datetime) -> SendResult:
    """Nothing is called: the notification shows until when it waits, and comes back then (a due
    time for the sweep, however near); the attempt keeps its state, so an unknown one is looked for
    again first. When the window opens only past the send deadline, it fails now, without a
    fallback: the deadline is the notification's."""
    now = ctx.clock()
    if prepare.past_deadline(job.created_at or now, job.send_at, now=opening, deadline_s=ctx.settings.send_deadline_s):
        return fail(job, ctx, WINDOW_PAST_DEADLINE, f"route {job.route_name!r} is in its quiet hours, and its send "
                                                     "window opens past the send deadline")
    with ctx.sessions.begin() as session:
        moves.wait_for_window(session, notification_id=job.notification_id, now=now,
                              detail=f"route {job.route_name!r} sends {job.route.send_window} only; "
                                     f"waits until {opening:%Y-%m-%d %H:%M} UTC")
    return SendResult(Outcome.RETRY, "quiet hours: waits for the route's send window",
                      delay_s=(opening - now).total_seconds(), deferred=True)


def look_for_earlier_message(job: SendJob, ctx: SendContext) -> SendResult | None:
    """An earlier try's message, adopted; or, when the read fails, a look again later. None: it does not exist."""
    try:
        message = call.find_earlier_message(job, ctx)
    except ApiError as error:
        return look_again_later(error, job, ctx)
    return record_acceptance(job, ctx, message, Outcome.ADOPTED) if message is not None else None


def look_again_later(error: ApiError, job: SendJob, ctx: SendContext) -> SendResult:
    """The read that looks for an earlier try's message failed, so that message may still exist.
    Neither the try count nor the fallback may end the attempt now: either could bring the person a
    second message. The look is tried again, backing off, until the send deadline; the attempt ends
    ``outcome_unknown`` (never falling back) past it, or at once when the conversation is gone (404)."""
    decision = decide_after(error, job, ctx)  # a failed read that reached the workspace is a try too, for the backoff
    if decision.kind is DecisionKind.PAUSE_WORKSPACE:
        # The attempt is left as it is (not queued again), so the first run after the pause looks first.
        return pause_workspace(decision, job.notification_id, None, ctx)
    gone = isinstance(error, NotFound)
    if gone or prepare.past_send_deadline(job, ctx.settings, now=ctx.clock()):
        why = "its conversation is gone" if gone else "the workspace could not be read by the send deadline"
        return fail(job, ctx, OUTCOME_UNKNOWN, f"an earlier try may have sent it and {why}; not sent again", looked=True)
    if decision.pause_s > 0:
        pause_after_429(ctx.limiter, decision.pause_s)
    delay_s = decision.delay_s or backoff_s(job.tries, base_s=ctx.plan.base_s, cap_s=ctx.plan.cap_s, rng=ctx.rng)
    log.info("attempt %s: looking for an earlier try's message failed (%s); looking again", job.attempt_id,
             decision.error_kind)
    return SendResult(Outcome.RETRY, f"looking for an earlier try's message: {decision.reason}", delay_s=delay_s)


def forgotten(error: ApiError, job: SendJob, ctx: SendContext) -> SendResult | None:
    """A 404 for what the store remembered (the conversation, or the contact behind it: deleted by
    an agent, or a reset workspace). The first time, forget every stored id of the contact and try
    again at once: the next run finds or makes them anew. A second 404 is final (``not_found``).
    Nothing was sent: the workspace answered 404 to the call itself."""
    if not isinstance(error, NotFound) or job.re_resolved:
        return None
    with ctx.sessions.begin() as session:
        store.forget_contact(session, account=ctx.settings.account,
                             keys=contact_keys(job.contact, key=ctx.settings.hashing_key))
        if not moves.re_resolve(session, attempt_id=job.attempt_id, seen_claims=job.claims, now=ctx.clock()):
            return None
    log.info("attempt %s: the workspace no longer has its contact or conversation (%s); resolving again",
             job.attempt_id, error.operation)
    return SendResult(Outcome.RETRY, f"{error.operation} 404: the contact or conversation is gone; resolving again",
                      delay_s=0.1)


def after_failed_create(error: ApiError, job: SendJob, ctx: SendContext) -> SendResult:
    decision = decide_after(error, job, ctx)
    if decision.kind is DecisionKind.PAUSE_WORKSPACE:  # refused or never connected: nothing was sent
        return pause_workspace(decision, job.notification_id, job, ctx)
    if error.ambiguous:
        # It may exist: the next run looks before it sends (state unknown skips the lease wait). The
        # policy never gives up blind on an ambiguous write: its answer here is "look first".
        with ctx.sessions.begin() as session:
            moves.mark_unknown(session, attempt_id=job.attempt_id, seen_claims=job.claims, now=ctx.clock(),
                               no_resend=None if decision.resend_allowed else (decision.error_kind, decision.reason))
    elif decision.kind is not DecisionKind.GIVE_UP:
        release(job, ctx)
    return apply_decision(decision, job, ctx)


def apply_decision(decision: Decision, job: SendJob, ctx: SendContext) -> SendResult:
    if decision.kind is DecisionKind.PAUSE_WORKSPACE:
        return pause_workspace(decision, job.notification_id, job, ctx)
    if decision.pause_s > 0:
        pause_after_429(ctx.limiter, decision.pause_s)
    if decision.kind is DecisionKind.GIVE_UP:
        return fail(job, ctx, decision.error_kind, decision.reason)
    return SendResult(Outcome.RETRY, decision.reason, delay_s=decision.delay_s, deferred=decision.deferred)


def release(job: SendJob, ctx: SendContext) -> bool:
    with ctx.sessions.begin() as session:
        return moves.release(session, attempt_id=job.attempt_id, seen_claims=job.claims, now=ctx.clock())


def record_acceptance(job: SendJob, ctx: SendContext, message: Message, outcome: Outcome) -> SendResult:
    now = ctx.clock()
    reported = attempt_state_from_status(message.status.value if message.status else None)
    # A message that has already failed when we record it (a recovered send whose failure webhook
    # came before we knew its ID) is recorded as sent; its failure is then applied like any
    # outcome below, so the single fallback decision is made.
    state = AttemptState.SENT if reported is AttemptState.FAILED else reported
    # An adopted message may already be delivered or read (its reports came while its send was
    # unrecorded, and no later report will drop the content): no other attempt can be needed any
    # more, as when the consumer applies delivered.
    drops_payload = job.drops_payload_on_acceptance or state in (AttemptState.DELIVERED, AttemptState.READ)
    with ctx.sessions.begin() as session:
        if moves.accept_outside_a_transaction(session, drops_payload=drops_payload):
            session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})  # one statement: its own transaction
        accepted = moves.accept(session, notification_id=job.notification_id, attempt_id=job.attempt_id,
                                message_id=message.id, state=state, now=now,
                                next_read_at=next_read_at(state=state, reports_read=reports_read(job.route.channel.value),
                                                          accepted_at=now, now=now, plan=readback_plan_of(ctx.settings)),
                                without_waiting=True)  # lost in a database crash? recovery adopts the message again
        if accepted is None:
            return SendResult(Outcome.SKIPPED, "the attempt was recorded by another worker")
        if drops_payload:
            store.drop_payload(session, job.notification_id)
    if reported is AttemptState.FAILED:
        tracking.apply_outcome(tracking.Outcome(message.id, "failed", message.external_error), ctx, ctx.enqueuer)
    if job.created_at is not None:
        metrics.SEND_LATENCY.observe(max((now - job.created_at).total_seconds(), 0.0))
    return SendResult(outcome, message_id=message.id)


def fail(job: SendJob, ctx: SendContext, error_kind: str, detail: str, *, looked: bool = False) -> SendResult:
    """End the attempt as failed with the error recorded; the first attempt's failure then gets
    the single fallback decision, the fallback's ends the notification.

    Out of tries, an attempt that an earlier run claimed looks first (one read, as after an
    ambiguous write): that run's message may exist (it died before recording it), and a fallback
    is for a message that does not exist or failed, never for one that may be delivered."""
    if error_kind == TRIES_EXHAUSTED and not looked and (found := look_for_earlier_message(job, ctx)) is not None:
        return found
    with ctx.sessions.begin() as session:
        moved = moves.fail_attempt(session, notification_id=job.notification_id, attempt_id=job.attempt_id,
                                   seen_claims=job.claims, error_kind=error_kind, detail=detail, now=ctx.clock())
    if not moved:  # another run claimed the attempt since this one read it (or ended it): it is that run's
        log.info("attempt %s of notification %s: %s, but another run has it", job.attempt_number, job.notification_id,
                 error_kind)
        return SendResult(Outcome.SKIPPED, f"{error_kind}, but the attempt moved on since this run read it")
    log.warning("attempt %s of notification %s failed: %s", job.attempt_number, job.notification_id, error_kind)
    tracking.settle_failure(job.notification_id, Failure(purpose=job.purpose, error_kind=error_kind, detail=detail), ctx,
                            ctx.enqueuer)
    return SendResult(Outcome.FAILED, f"{error_kind}: {detail}")
