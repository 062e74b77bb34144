"""The send path: one notification's current attempt, from the store to an accepted message.

At least once: the task that runs this may run again after a crash, a redelivery or a sweep.
At most one message: every transition is a compare-and-set; before createMessage the attempt is
marked in flight under a lease, and an attempt left in flight or unknown is first looked for in
the conversation (:mod:`dispatcher.sending.recover`) and adopted, never blindly sent again.

A run is four steps, one module each (docs/sending.md draws them):

* :mod:`~dispatcher.sending.claim` reads the notification and its attempt, guards them, and
  takes the attempt for this run (on the warm path in the same transaction);
* :mod:`~dispatcher.sending.prepare` decides, without asking anyone, what goes: template or free
  text, quiet hours, the send deadline;
* :mod:`~dispatcher.sending.call` makes the workspace calls: inbox, contact, source_id and
  conversation where the store does not know them (:mod:`dispatcher.sending.resolve`), then
  createMessage;
* :mod:`~dispatcher.sending.record` writes what the answer means: accepted, a retry, a failure and
  the single decision that follows it (:func:`dispatcher.tracking.outcomes.settle_failure`).

No Celery here: the caller turns a :class:`SendResult` into a retry.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from dispatcher import tracing
from dispatcher.api import ApiError
from dispatcher.context import SendContext, Wait
from dispatcher.errors import InvalidEvent
from dispatcher.lifecycle.states import AttemptState
from dispatcher.policy.breaker import Pause, Probe
from dispatcher.sending import call, claim, prepare, record
from dispatcher.sending.claim import set_aside_unconfigured
from dispatcher.sending.job import TRIES_EXHAUSTED, MessageBody, Outcome, OwedDecision, SendJob, SendResult
from dispatcher.sending.resolve import NotContactable
from dispatcher.store import queries as store

__all__ = ["TRIES_EXHAUSTED", "Outcome", "SendResult", "send_notification", "set_aside_unconfigured"]

log = logging.getLogger(__name__)


def send_notification(notification_id: int, ctx: SendContext) -> SendResult:
    """Bring the notification's current attempt one step nearer an accepted message.

    Nothing is called while the workspace's circuit breaker is open (it refused our token, or
    could not be reached): the notification waits, saying why, until one worker's probe gets
    through (:mod:`dispatcher.policy.breaker`). A wait longer than the retry plan's
    ``max_countdown_s`` comes back ``deferred``: the caller keeps it as a due time, never as a
    broker countdown.
    """
    with tracing.continued(_trace_parent(notification_id, ctx), "dispatcher.send",
                           {"dispatcher.notification_id": notification_id,
                            "dispatcher.workspace": ctx.settings.workspace_name}) as span:
        result = _run(notification_id, ctx)
        tracing.set_attribute(span, "dispatcher.outcome", result.outcome.value)
    if result.outcome is Outcome.RETRY and not result.deferred and result.delay_s > ctx.plan.max_countdown_s:
        return replace(result, deferred=True)
    return result


def _trace_parent(notification_id: int, ctx: SendContext) -> str | None:
    """The notification's trace, read only while tracing is on (one small query a run)."""
    if not tracing.enabled():
        return None
    with ctx.sessions() as session:
        return store.trace_parent_of(session, notification_id)


def _run(notification_id: int, ctx: SendContext) -> SendResult:
    gate = ctx.breaker.gate()
    if isinstance(gate, Pause):
        return record.wait_for_workspace(notification_id, None, gate, ctx)
    try:
        ctx.inboxes.warm()  # an API call at most once per cache period, never inside a transaction
    except ApiError as error:
        paused = record.pause_before_job(error, notification_id, ctx)
        if paused is not None:
            return paused
        # Any other failure: the slow path lists the inboxes again, inside the job, where a
        # failure counts one of the attempt's tries, so it cannot loop past the retry limit.
    job_or_result = claim.claim(notification_id, ctx)
    if isinstance(job_or_result, OwedDecision):
        return record.make_owed_decision(notification_id, job_or_result.number, ctx)
    if isinstance(job_or_result, SendResult):
        return job_or_result
    job = job_or_result
    if job.urgent:  # this run's calls take urgent's share and go first (dispatcher.context.call_api)
        ctx = replace(ctx, urgent=True)
    result = _run_job(job, gate, ctx)
    if result.outcome in (Outcome.RETRY, Outcome.SKIPPED):
        record.end_run(job, ctx)
    return result


def _run_job(job: SendJob, gate: object, ctx: SendContext) -> SendResult:
    try:
        result = _send(job, ctx)
    except Wait as wait:
        return record.waited(wait, job, ctx)
    except NotContactable as error:
        return record.fail(job, ctx, "not_contactable", str(error))
    except InvalidEvent as error:
        return record.fail(job, ctx, "invalid_for_channel", str(error))
    except ApiError as error:  # a step before createMessage: nothing was sent by this try
        return record.forgotten(error, job, ctx) or record.apply_decision(record.decide_after(error, job, ctx), job, ctx)
    if isinstance(gate, Probe) and not result.paused and result.outcome is not Outcome.RETRY:
        record.breaker_closed(ctx)  # the probe got an answer (a retry may be a 5xx: the pause goes on)
    elif result.outcome is Outcome.ACCEPTED:
        ctx.breaker.answered()  # createMessage was answered: a streak of 5xx, if any, ends
    return result


def _send(job: SendJob, ctx: SendContext) -> SendResult:
    """claim (done) → prepare → call → record. The warm path's claim started the attempt; the
    slow path first settles what an earlier try left, then resolves where the message goes and
    claims the attempt for it."""
    if job.started is not None and job.body is not None:
        return _call_and_record(job, ctx, job.started.conversation_id, job.body)
    if (ended := _before_any_call(job, ctx)) is not None:
        return ended
    target = call.resolve_target(job, ctx)
    if target is None:
        return record.fail(job, ctx, "inbox_not_found", f"route {job.route_name!r} names no inbox of the workspace")
    body = prepare.message_body(job, ctx.settings, window_open=target.window_open)
    claimed = claim.claim_resolved(job, ctx, target, body)
    if isinstance(claimed, SendResult):
        return claimed
    return _call_and_record(claimed, ctx, target.conversation_id, body)


def _before_any_call(job: SendJob, ctx: SendContext) -> SendResult | None:
    """What ends or holds the run before a lookup: another worker's call still running, an earlier
    try's message (looked for, adopted), the tries spent, quiet hours, a recipient who said no.
    None: go on."""
    if job.attempt_state is AttemptState.IN_FLIGHT and job.lease_active_s > 0:
        return SendResult(Outcome.RETRY, "another worker's createMessage may still be running", delay_s=job.lease_active_s + 1)
    if job.attempt_state in (AttemptState.IN_FLIGHT, AttemptState.UNKNOWN):
        if (found := record.look_for_earlier_message(job, ctx)) is not None:
            return found
        if job.no_resend:
            return record.fail(job, ctx, "not_found_after_unknown_outcome", "the earlier answer was unreadable and no message exists")
    if job.tries >= ctx.plan.max_tries:
        return record.fail(job, ctx, TRIES_EXHAUSTED, f"{job.tries} tries used")
    if (opening := prepare.window_opening(job, ctx.settings, now=ctx.clock())) is not None:
        return record.outside_window(job, ctx, opening)
    if job.attempt_state is not AttemptState.QUEUED:  # a queued one was asked by the claim
        with ctx.sessions.begin() as session:  # before any lookup: no contact is made for a person who said no
            return claim.refuse_if_said_no(session, job, ctx, now=ctx.clock())
    return None


def _call_and_record(job: SendJob, ctx: SendContext, conversation_id: int, body: MessageBody) -> SendResult:
    try:
        message = call.create_message(job, ctx, conversation_id, body)
    except Wait:
        record.release(job, ctx)
        raise
    except ApiError as error:
        return record.forgotten(error, job, ctx) or record.after_failed_create(error, job, ctx)
    return record.record_acceptance(job, ctx, message, Outcome.ACCEPTED)
