"""The send path: one notification's current attempt, from the store to an accepted message.

At least once: the task that runs this may run again after a crash, a redelivery or a sweep.
At most one message: every transition is a compare-and-set; before createMessage the attempt is
marked in flight under a lease, and an attempt left in flight or unknown is first looked for in
the conversation (:mod:`dispatcher.sending.recover`) and adopted, never blindly sent again.

Steps, as the contract orders them: load and guard; recover an ambiguous earlier try; choose the
inbox, find or create the contact, its source_id and the conversation (:mod:`dispatcher.sending.resolve`);
apply the channel rules; take a limiter slot, mark in flight, call createMessage; record the
message ID and status. No Celery here: the caller turns a :class:`SendResult` into a retry.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from dispatcher import metrics, tracing
from dispatcher.api import ApiError, Message, NotFound
from dispatcher.api.errors import ApiStatusError, ServerError
from dispatcher.context import SendContext, Wait, call_api, pause_after_429, readback_plan_of
from dispatcher.errors import InvalidEvent
from dispatcher.intake.request import ContactDetails, SendPayload
from dispatcher.lifecycle import moves
from dispatcher.lifecycle.states import (
    AFTER_DECISION_PURPOSES,
    SENDABLE_ATTEMPT_STATES,
    SENDABLE_NOTIFICATION_STATES,
    AttemptPurpose,
    AttemptState,
    attempt_state_from_status,
)
from dispatcher.policy.backoff import backoff_s
from dispatcher.policy.breaker import Pause, Probe
from dispatcher.policy.channels import MessageKind, choose_message_kind, reports_read, template_params
from dispatcher.policy.channels import window_open as service_window_open
from dispatcher.policy.fallback import OUTCOME_UNKNOWN, SEND_DEADLINE, WINDOW_PAST_DEADLINE, Failure
from dispatcher.policy.quiet_hours import within_window
from dispatcher.policy.ratelimit import route_bucket
from dispatcher.policy.readback import next_read_at
from dispatcher.policy.retry import Decision, DecisionKind, decide
from dispatcher.queues import Priority
from dispatcher.recipients.keys import keys_of_contact
from dispatcher.recipients.policy import needs_consent
from dispatcher.sending.recover import find_sent_message
from dispatcher.sending.resolve import (
    NotContactable,
    contact_keys,
    linked_conversation,
    resolve_contact,
    resolve_conversation,
    resolve_source_id,
)
from dispatcher.settings import Route
from dispatcher.store import queries as store
from dispatcher.store.suppressions import Blocked, blocking_reason, refusal_clause
from dispatcher.tracking import outcomes as tracking

log = logging.getLogger(__name__)

TRIES_EXHAUSTED = "tries_exhausted"


class Outcome(StrEnum):
    ACCEPTED = "accepted"  # createMessage answered: the message exists
    ADOPTED = "adopted"  # an earlier, ambiguous try had sent it: found and recorded
    FAILED = "failed"  # the attempt ended without a message
    SKIPPED = "skipped"  # nothing to do (already done, not due, or another worker holds it)
    RETRY = "retry"  # try again after delay_s
    SET_ASIDE = "set_aside"  # the task kept dying on this attempt: kept, marked crash_loop, for an operator


@dataclass(frozen=True)
class SendResult:
    outcome: Outcome
    reason: str = ""
    delay_s: float = 0.0
    deferred: bool = False  # the wait is long: keep it as a due time, not a broker countdown
    message_id: int | None = None
    paused: bool = False  # the workspace's circuit breaker held this run back


@dataclass(frozen=True)
class _Target:
    """Where the message goes: everything createMessage needs besides the body."""

    inbox_id: int
    contact_id: int
    conversation_id: int
    window_open: bool


@dataclass(frozen=True)
class _Job:
    """What the send needs from the database, read in one short transaction."""

    notification_id: int
    attempt_id: int
    attempt_number: int
    purpose: AttemptPurpose
    attempt_state: AttemptState
    route_name: str
    route: Route
    tries: int  # provider tries so far: calls of this attempt's that reached the workspace and failed
    payload: SendPayload | None  # None: gone, or unreadable (the run fails the attempt)
    drops_payload_on_acceptance: bool
    lease_active_s: float
    conversation_id: int | None
    content_hash: str | None
    in_flight_since: Any
    claims: int  # the attempt's claims as this run knows them (read, then its own claim): moves it makes check them
    category: str = "service"  # what the recipient may have opted out of, besides the channel
    urgent: bool = False  # its calls come first to the rate limits (docs/priorities.md)
    no_resend: bool = False  # an earlier try may have been accepted: look, but never send again
    re_resolved: bool = False  # a 404 already made this attempt forget its contact once
    created_at: datetime | None = None  # when the notification was stored, for the latency metric
    send_at: datetime | None = None  # when a scheduled notification became due
    started: _Target | None = None  # the warm path: already marked in flight, send at once
    body: MessageBody | None = None

    @property
    def contact(self) -> ContactDetails:
        assert self.payload is not None  # _load fails a job without one before any step runs
        return self.payload.contact


@dataclass(frozen=True)
class MessageBody:
    """createMessage's body: the content, and the template's parameters when it goes as a template."""

    content: str = field(repr=False)
    template_params: dict[str, Any] | None = field(default=None, repr=False)


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
        return _wait_for_workspace(notification_id, None, gate, ctx)
    try:
        ctx.inboxes.warm()  # an API call at most once per cache period, never inside a transaction
    except ApiError as error:
        paused = _pause_before_job(error, notification_id, ctx)
        if paused is not None:
            return paused
        # Any other failure: the slow path lists the inboxes again, inside the job, where a
        # failure counts one of the attempt's tries, so it cannot loop past the retry limit.
    job_or_result = _load(notification_id, ctx)
    if isinstance(job_or_result, _OwedDecision):
        return _make_owed_decision(notification_id, job_or_result.number, ctx)
    if isinstance(job_or_result, SendResult):
        return job_or_result
    job = job_or_result
    if job.urgent:  # this run's calls take urgent's share and go first (dispatcher.context.call_api)
        ctx = replace(ctx, urgent=True)
    result = _run_job(job, gate, ctx)
    if result.outcome in (Outcome.RETRY, Outcome.SKIPPED):
        _end_run(job, ctx)
    return result


def _make_owed_decision(notification_id: int, number: int, ctx: SendContext) -> SendResult:
    """The current attempt failed and its notification is still to be sent, so the failure's
    decision is owed: the run that recorded the failure died before it (or is making it now).
    Made here, not by the sweep; it calls nothing, so a paused workspace does not hold it up."""
    owed = tracking.finish_owed_decision(notification_id, ctx, ctx.enqueuer)
    return SendResult(Outcome.SKIPPED, f"attempt {number} is failed" + (f"; its owed decision made now: {owed}" if owed else ""))


def _run_job(job: _Job, gate: object, ctx: SendContext) -> SendResult:
    try:
        result = _send(job, ctx)
    except Wait as wait:
        return _waited(wait, job, ctx)
    except NotContactable as error:
        return _fail(job, ctx, "not_contactable", str(error))
    except InvalidEvent as error:
        return _fail(job, ctx, "invalid_for_channel", str(error))
    except ApiError as error:  # a step before createMessage: nothing was sent by this try
        return _forgotten(error, job, ctx) or _apply(_decide(error, job, ctx), job, ctx)
    if isinstance(gate, Probe) and not result.paused and result.outcome is not Outcome.RETRY:
        _breaker_closed(ctx)  # the probe got an answer (a retry may be a 5xx: the pause goes on)
    elif result.outcome is Outcome.ACCEPTED:
        ctx.breaker.answered()  # createMessage was answered: a streak of 5xx, if any, ends
    return result


def _end_run(job: _Job, ctx: SendContext) -> None:
    """The run ends without dying (it waits, retries later, or found nothing to do): it is not
    counted as a crash. Only runs that never get here (a killed process, a bug that kills it)
    stay counted, toward ``send_max_runs``."""
    with ctx.sessions.begin() as session:
        moves.end_run(session, attempt_id=job.attempt_id)


def _decide(error: ApiError, job: _Job, ctx: SendContext) -> Decision:
    """The retry policy's decision after a call of this run's failed. A call that reached the
    workspace (answered, refused, timed out) spends one provider try, counted before the decision
    is applied; a refused token or no connection pauses every worker and spends none."""
    _note_answer(error, job.notification_id, ctx)
    decision = decide(error, tries=job.tries + 1, plan=ctx.plan, rng=ctx.rng)
    if decision.kind is not DecisionKind.PAUSE_WORKSPACE:
        with ctx.sessions.begin() as session:
            moves.count_try(session, attempt_id=job.attempt_id, now=ctx.clock(), max_tries=ctx.plan.max_tries)
    return decision


def _waited(wait: Wait, job: _Job, ctx: SendContext) -> SendResult:
    """No call was made (our limiter said not now, or another worker is making the conversation):
    no try is spent. Past the send deadline the notification stops waiting and fails, saying so,
    so a wait that never ends cannot keep it open."""
    if _past_send_deadline(job, ctx):
        return _fail(job, ctx, SEND_DEADLINE, f"past the send deadline, still waiting: {wait.reason}")
    return SendResult(Outcome.RETRY, wait.reason, delay_s=wait.delay_s)


def _pause_workspace(decision: Decision, notification_id: int, held: _Job | None, ctx: SendContext) -> SendResult:
    """The policy said: the workspace refuses our token or cannot be reached. Trip the breaker for
    every worker, and wait (not fail). ``held``: the run's job, when its attempt goes back to queued."""
    pause, opened = ctx.breaker.trip(decision.error_kind, decision.reason)
    if opened:  # one line per pause, not one per notification
        log.warning("workspace paused for every worker: %s; trying again in %.0f s",
                    pause.reason, max(pause.until - time.time(), 0.0))
        metrics.WORKSPACE_PAUSES.labels(reason=pause.reason).inc()
    return _wait_for_workspace(notification_id, held, pause, ctx)


def _note_answer(error: ApiError, notification_id: int, ctx: SendContext) -> None:
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


def _breaker_closed(ctx: SendContext) -> None:
    if ctx.breaker.close():
        log.warning("workspace answers again: every worker goes on sending")


def _wait_for_workspace(notification_id: int, held: _Job | None, pause: Pause, ctx: SendContext) -> SendResult:
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
        if not owed and not _past_deadline(row.created_at, row.send_at, now=now, deadline_s=ctx.settings.send_deadline_s):
            moves.wait_for_workspace(session, notification_id=notification_id,
                                     attempt_id=held.attempt_id if held else None,
                                     seen_claims=held.claims if held else None,
                                     reason=pause.reason, detail=pause.detail, now=now)
            wait_s = max(pause.until - time.time(), 1.0)
            return SendResult(Outcome.RETRY, f"workspace paused ({pause.reason})", delay_s=wait_s, deferred=True,
                              paused=True)
        failed = None if owed else _fail_past_deadline(session, row, held, pause, ctx, now=now)
    if failed is None:
        return _make_owed_decision(notification_id, row.current_attempt, ctx)
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


def _fail_past_deadline(session: Session, row: Any, held: _Job | None, pause: Pause, ctx: SendContext, *,
                        now: datetime) -> _DeadlineFailure:
    """The workspace stayed away past the send deadline: the current attempt fails with the pause's reason."""
    number, route_name, purpose = _current_attempt(row)
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


def _pause_before_job(error: ApiError, notification_id: int, ctx: SendContext) -> SendResult | None:
    """The inbox list failed before the run took its attempt: only a reason to pause every
    worker (a refused token, no connection) stops the run here; a 429 also pauses the limiter."""
    _note_answer(error, notification_id, ctx)
    decision = decide(error, tries=1, plan=ctx.plan, rng=ctx.rng)
    if decision.kind is DecisionKind.PAUSE_WORKSPACE:
        return _pause_workspace(decision, notification_id, None, ctx)
    if decision.pause_s > 0:
        pause_after_429(ctx.limiter, decision.pause_s)
    return None


@dataclass(frozen=True)
class _OwedDecision:
    """The current attempt failed and its notification is still to be sent: its decision is owed."""

    number: int


def _load(notification_id: int, ctx: SendContext) -> _Job | SendResult | _OwedDecision:
    """Read what the send needs; on the warm path (everything known), also mark it in flight."""
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        notification = store.load_for_send(session, notification_id)
        if notification is None:
            return SendResult(Outcome.SKIPPED, "no such notification")
        if notification.state not in SENDABLE_NOTIFICATION_STATES:
            return SendResult(Outcome.SKIPPED, f"notification is {notification.state}")
        number, route_name, purpose = _current_attempt(notification)
        route = ctx.settings.routes.get(route_name)
        if route is None:
            return SendResult(Outcome.SKIPPED, f"route {route_name!r} is no longer configured")
        attempt = moves.open_attempt(
            session, notification_id=notification.id, number=number, route=route_name, channel=route.channel.value, now=now
        )
        if attempt.state == AttemptState.FAILED:
            return _OwedDecision(number)
        if attempt.state not in SENDABLE_ATTEMPT_STATES:
            return SendResult(Outcome.SKIPPED, f"attempt {number} is {attempt.state}")
        if attempt.runs > ctx.settings.send_max_runs:
            return _set_aside(session, notification.id, number, attempt.runs - 1, now=now)
        payload, unreadable = _payload_of(notification.body)
        job = _Job(
            notification_id=notification.id,
            attempt_id=attempt.id,
            attempt_number=number,
            purpose=purpose,
            attempt_state=AttemptState(attempt.state),
            route_name=route_name,
            route=route,
            tries=attempt.tries,
            payload=payload,
            drops_payload_on_acceptance=_last_possible_attempt(purpose, notification.fallback_route, payload),
            lease_active_s=(attempt.lease_until - now).total_seconds() if attempt.lease_until else 0.0,
            conversation_id=attempt.conversation_id,
            content_hash=attempt.content_hash,
            in_flight_since=attempt.in_flight_since,
            claims=attempt.claims,
            no_resend=attempt.state == AttemptState.UNKNOWN and attempt.error_kind not in (None, moves.RE_RESOLVING),
            re_resolved=attempt.error_kind == moves.RE_RESOLVING,
            created_at=notification.created_at,
            send_at=notification.send_at,
            category=notification.category,
            urgent=notification.priority == Priority.URGENT,
        )
        if payload is None:
            pass  # failed below, outside this transaction
        elif job.attempt_state is AttemptState.QUEUED:
            # The warm path's claim refuses a recipient who said no in its own statement; any
            # other queued attempt is asked here, before any call (an in-flight or unknown one is
            # looked for first, in _send). In quiet hours nothing starts: _send waits.
            if job.tries < ctx.plan.max_tries and _window_opening(job, ctx, now=now) is None:
                job = _start_if_known(session, job, ctx, now=now)
            if job.started is None and (blocked := _recipient_said_no(session, job, ctx, now=now)):
                if blocked.outcome is Outcome.SKIPPED:  # lost a race to another worker: no crash
                    moves.end_run(session, attempt_id=job.attempt_id)
                return blocked
        if job.started is None:
            store.touch_for_run(session, job.notification_id, now=now)
    if unreadable:
        return _fail(job, ctx, "payload_unreadable", "the notification's stored payload cannot be read")
    if payload is None:
        return _fail(job, ctx, "payload_missing", "the notification's payload is gone")
    return job


def _window_opening(job: _Job, ctx: SendContext, *, now: datetime) -> datetime | None:
    """When the attempt's route opens its send window, if it is closed now (quiet hours). At intake
    a notification due at night is scheduled for the opening; this holds every later start to the
    window too: a fallback decided at night, a host's retry, a run delayed past the close, a resend
    after an unknown outcome (looked for first, as always)."""
    if job.payload is None or job.route.send_window is None:
        return None
    return within_window(None, job.contact.time_zone, job.route, ctx.settings, now=now)


def _outside_window(job: _Job, ctx: SendContext, opening: datetime) -> SendResult:
    """Nothing is called: the notification shows until when it waits, and comes back then (a due
    time for the sweep, however near); the attempt keeps its state, so an unknown one is looked for
    again first. When the window opens only past the send deadline, it fails now, without a
    fallback: the deadline is the notification's."""
    now = ctx.clock()
    if _past_deadline(job.created_at or now, job.send_at, now=opening, deadline_s=ctx.settings.send_deadline_s):
        return _fail(job, ctx, WINDOW_PAST_DEADLINE, f"route {job.route_name!r} is in its quiet hours, and its send "
                                                     "window opens past the send deadline")
    with ctx.sessions.begin() as session:
        moves.wait_for_window(session, notification_id=job.notification_id, now=now,
                              detail=f"route {job.route_name!r} sends {job.route.send_window} only; "
                                     f"waits until {opening:%Y-%m-%d %H:%M} UTC")
    return SendResult(Outcome.RETRY, "quiet hours: waits for the route's send window",
                      delay_s=(opening - now).total_seconds(), deferred=True)


def _set_aside(session: Session, notification_id: int, number: int, died: int, *, now: datetime) -> SendResult:
    """The send task died ``died`` times on this attempt (killed mid-run, or a bug that kills its
    process): stop running it. The notification keeps its state and its attempt (which may be in
    flight: the next run looks for its message first), shows ``crash_loop`` with why, and waits
    for an operator's ``dispatcher retry``. Not a provider failure: no fallback, no tries spent."""
    detail = f"the send task died {died} times on attempt {number}; set aside until `dispatcher retry`"
    moves.set_aside(session, notification_id=notification_id, detail=detail, now=now)
    log.error("notification %s set aside: %s: %s", notification_id, moves.CRASH_LOOP, detail)
    return SendResult(Outcome.SET_ASIDE, f"{moves.CRASH_LOOP}: {detail}")


def set_aside_unconfigured(notification_id: int, workspace: str, ctx: SendContext) -> SendResult:
    """The notification's workspace is no longer configured: nothing may be sent through another.
    Set it aside, saying so, so that the sweep stops handing it over (it would forever), until the
    workspace is configured again and an operator runs ``dispatcher retry``."""
    detail = f"its workspace {workspace!r} is not configured; set aside until it is and `dispatcher retry`"
    with ctx.sessions.begin() as session:
        moves.set_aside(session, notification_id=notification_id, detail=detail, now=ctx.clock(),
                        error_kind=moves.WORKSPACE_UNCONFIGURED)
    log.error("notification %s set aside: %s", notification_id, moves.WORKSPACE_UNCONFIGURED)
    return SendResult(Outcome.SET_ASIDE, f"{moves.WORKSPACE_UNCONFIGURED}: {detail}")


def _payload_of(stored: dict[str, Any] | None) -> tuple[SendPayload | None, bool]:
    """The stored payload as its record; and whether one was stored but cannot be read (written
    by another version, or damaged): retrying cannot make it readable."""
    if stored is None:
        return None, False
    try:
        return SendPayload.model_validate(stored), False
    except ValidationError:
        return None, True


def _start_if_known(session: Session, job: _Job, ctx: SendContext, *, now: datetime) -> _Job:
    """The warm path: with inbox, contact, source_id and conversation all known, mark the
    attempt in flight in the loading transaction itself (one commit before createMessage)."""
    inbox = ctx.inboxes.cached(job.route)
    if inbox is None:
        return job
    contact_id, source_id, conversation_id, last_incoming = store.cached_target(
        session, account=ctx.settings.account, keys=contact_keys(job.contact, key=ctx.settings.hashing_key),
        inbox_id=inbox.id
    )
    window = service_window_open(last_incoming, now=now)
    if contact_id is None or source_id is None or conversation_id is None:
        return job
    target = _Target(inbox_id=inbox.id, contact_id=contact_id, conversation_id=conversation_id, window_open=window)
    try:
        body = _message_body(job, ctx, window_open=window)
    except InvalidEvent:
        return job  # the slow path fails it with the error recorded
    if not _mark_in_flight(session, job, ctx, target, body, now=now):
        return job
    return replace(job, started=target, body=body, claims=job.claims + 1)  # its own claim: the attempt is this run's


def _recipient_said_no(session: Session, job: _Job, ctx: SendContext, *, now: datetime) -> SendResult | None:
    """The recipient opted out of this channel and category, or the route needs consent that is
    not recorded: end the notification (no call, no fallback) in the caller's transaction, the
    one that would claim the attempt. None: the send may go on."""
    blocked = blocking_reason(session, account=ctx.settings.account,
                              keys=keys_of_contact(job.contact, key=ctx.settings.hashing_key),
                              channel=job.route.channel.value, category=job.category,
                              needs_consent=needs_consent(job.route, ctx.settings))
    if blocked is None:
        return None
    if blocked is Blocked.OPTED_OUT:
        detail = f"the recipient opted out of {job.route.channel.value} ({job.category}); nothing was sent"
    else:
        detail = f"route {job.route_name!r} needs the recipient's consent and none is recorded; nothing was sent"
    if not moves.end_opted_out(session, notification_id=job.notification_id, attempt_id=job.attempt_id,
                               error_kind=blocked.value, detail=detail, now=now, seen_claims=job.claims):
        return SendResult(Outcome.SKIPPED, "the attempt moved on since this run read it")
    store.drop_payload(session, job.notification_id)  # nothing more will be sent: the content goes now
    log.warning("attempt %s of notification %s not sent: %s", job.attempt_number, job.notification_id, blocked.value)
    metrics.RECIPIENT_REFUSALS.labels(reason=blocked.value).inc()
    return SendResult(Outcome.FAILED, f"{blocked.value}: {detail}")


def _mark_in_flight(
    session: Session, job: _Job, ctx: SendContext, target: _Target, body: MessageBody, *, now: datetime
) -> bool:
    return moves.claim(
        session,
        notification_id=job.notification_id,
        attempt_id=job.attempt_id,
        fallback=job.purpose is AttemptPurpose.FALLBACK,
        target=moves.Target(inbox_id=target.inbox_id, contact_id=target.contact_id,
                            conversation_id=target.conversation_id, channel=job.route.channel.value,
                            content_hash=store.content_hash(body.content)),
        now=now,
        lease_until=now + timedelta(seconds=ctx.settings.send_lease_s),
        seen_claims=job.claims,
        refused_when=refusal_clause(account=ctx.settings.account,
                                    keys=keys_of_contact(job.contact, key=ctx.settings.hashing_key),
                                    channel=job.route.channel.value, category=job.category,
                                    needs_consent=needs_consent(job.route, ctx.settings)),
    )


def _current_attempt(row: Any) -> tuple[int, str, AttemptPurpose]:
    """The notification's current attempt: its number, route and purpose. Its row exists once made
    (the template resend and the fallback are made by the move that decides them); the first
    attempt's is made by its first run, through the notification's route."""
    if row.attempt_route is None:
        return row.current_attempt, row.route, AttemptPurpose.FIRST
    return row.current_attempt, row.attempt_route, AttemptPurpose(row.attempt_purpose)


def _last_possible_attempt(purpose: AttemptPurpose, fallback_route: str | None, payload: SendPayload | None) -> bool:
    """No other attempt can follow this one's acceptance, so its content may go with it: the
    fallback or a retry, or one with no fallback route that no template resend can follow."""
    if purpose in AFTER_DECISION_PURPOSES:
        return True
    may_resend = purpose is AttemptPurpose.FIRST and payload is not None and payload.template is not None
    return fallback_route is None and not may_resend


def _send(job: _Job, ctx: SendContext) -> SendResult:
    if job.started is not None and job.body is not None:
        return _create_message(job, ctx, job.started.conversation_id, job.body)
    if job.attempt_state is AttemptState.IN_FLIGHT and job.lease_active_s > 0:
        return SendResult(Outcome.RETRY, "another worker's createMessage may still be running", delay_s=job.lease_active_s + 1)
    if job.attempt_state in (AttemptState.IN_FLIGHT, AttemptState.UNKNOWN):
        if (found := _look_for_earlier_message(job, ctx)) is not None:
            return found
        if job.no_resend:
            return _fail(job, ctx, "not_found_after_unknown_outcome", "the earlier answer was unreadable and no message exists")
    if job.tries >= ctx.plan.max_tries:
        return _fail(job, ctx, TRIES_EXHAUSTED, f"{job.tries} tries used")
    if (opening := _window_opening(job, ctx, now=ctx.clock())) is not None:
        return _outside_window(job, ctx, opening)
    if job.attempt_state is not AttemptState.QUEUED:  # a queued one was asked in _load
        with ctx.sessions.begin() as session:  # before any lookup: no contact is made for a person who said no
            if (blocked := _recipient_said_no(session, job, ctx, now=ctx.clock())) is not None:
                return blocked

    inbox = ctx.inboxes.resolve(job.route)
    if inbox is None:
        return _fail(job, ctx, "inbox_not_found", f"route {job.route_name!r} names no inbox of the workspace")
    contact_id, returned_source_id = resolve_contact(ctx, job.contact, inbox_id=inbox.id)
    conversation_id = linked_conversation(ctx, contact_id=contact_id, inbox_id=inbox.id)
    if conversation_id is None:
        source_id = resolve_source_id(ctx, contact_id=contact_id, inbox_id=inbox.id, returned=returned_source_id)
        conversation_id = resolve_conversation(ctx, contact_id=contact_id, inbox_id=inbox.id, source_id=source_id)
    with ctx.sessions() as session:
        window = service_window_open(store.last_incoming_at(session, account=ctx.settings.account, contact_id=contact_id,
                                                    inbox_id=inbox.id), now=ctx.clock())
    body = _message_body(job, ctx, window_open=window)
    target = _Target(inbox_id=inbox.id, contact_id=contact_id, conversation_id=conversation_id, window_open=window)
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        # The claim refuses a recipient who said no while this run looked the contact up; then
        # the same transaction ends the notification, saying why.
        taken = _mark_in_flight(session, job, ctx, target, body, now=now)
        blocked = None if taken else _recipient_said_no(session, job, ctx, now=now)
    if blocked is not None:
        return blocked
    if not taken:
        return SendResult(Outcome.SKIPPED, "another worker claimed the attempt since this run read it")
    return _create_message(replace(job, claims=job.claims + 1), ctx, conversation_id, body)  # its own claim counted


def _create_message(job: _Job, ctx: SendContext, conversation_id: int, body: MessageBody) -> SendResult:
    buckets = (route_bucket(job.route_name),) if job.route.max_per_minute is not None else ()
    try:
        message = call_api(ctx, lambda: ctx.api.create_message(conversation_id, content=body.content,
                                                               template_params=body.template_params), *buckets)
    except Wait:
        _release(job, ctx)
        raise
    except ApiError as error:
        return _forgotten(error, job, ctx) or _after_failed_create(error, job, ctx)
    return _record_acceptance(job, ctx, message, Outcome.ACCEPTED)


def _message_body(job: _Job, ctx: SendContext, *, window_open: bool) -> MessageBody:
    """Template or free text, as the channel and the customer-service window allow."""
    assert job.payload is not None  # _load fails a job without one before any step runs
    template = job.payload.template
    kind = choose_message_kind(
        channel=job.route.channel,
        template_required=job.route.template_required or job.purpose is AttemptPurpose.TEMPLATE,
        window_open=window_open,
        has_template=template is not None,
    )
    if kind is not MessageKind.TEMPLATE:
        return MessageBody(job.payload.content)
    assert template is not None  # choose_message_kind refuses a template kind without one
    registered = ctx.settings.template(template.name, template.language)
    if registered is None:
        raise InvalidEvent("template.name", "is no longer in the template registry")
    return MessageBody(job.payload.content, template_params(registered, template.params))


def _look_for_earlier_message(job: _Job, ctx: SendContext) -> SendResult | None:
    """An earlier try's message, adopted; or, when the read fails, a look again later. None: it does not exist."""
    try:
        return _recover(job, ctx)
    except ApiError as error:
        return _look_again_later(error, job, ctx)


def _recover(job: _Job, ctx: SendContext) -> SendResult | None:
    """An earlier try may have sent the message: adopt it if it is there."""
    if job.conversation_id is None or job.content_hash is None or job.in_flight_since is None:
        return None
    message = find_sent_message(
        ctx, conversation_id=job.conversation_id, content_hash=job.content_hash, since=job.in_flight_since
    )
    if message is None:
        log.info("attempt %s: no message found after an unknown outcome; sending", job.attempt_id)
        return None
    return _record_acceptance(job, ctx, message, Outcome.ADOPTED)


def _look_again_later(error: ApiError, job: _Job, ctx: SendContext) -> SendResult:
    """The read that looks for an earlier try's message failed, so that message may still exist.
    Neither the try count nor the fallback may end the attempt now: either could bring the person a
    second message. The look is tried again, backing off, until the send deadline; the attempt ends
    ``outcome_unknown`` (never falling back) past it, or at once when the conversation is gone (404)."""
    decision = _decide(error, job, ctx)  # a failed read that reached the workspace is a try too, for the backoff
    if decision.kind is DecisionKind.PAUSE_WORKSPACE:
        # The attempt is left as it is (not queued again), so the first run after the pause looks first.
        return _pause_workspace(decision, job.notification_id, None, ctx)
    gone = isinstance(error, NotFound)
    if gone or _past_send_deadline(job, ctx):
        why = "its conversation is gone" if gone else "the workspace could not be read by the send deadline"
        return _fail(job, ctx, OUTCOME_UNKNOWN, f"an earlier try may have sent it and {why}; not sent again", looked=True)
    if decision.pause_s > 0:
        pause_after_429(ctx.limiter, decision.pause_s)
    delay_s = decision.delay_s or backoff_s(job.tries, base_s=ctx.plan.base_s, cap_s=ctx.plan.cap_s, rng=ctx.rng)
    log.info("attempt %s: looking for an earlier try's message failed (%s); looking again", job.attempt_id,
             decision.error_kind)
    return SendResult(Outcome.RETRY, f"looking for an earlier try's message: {decision.reason}", delay_s=delay_s)


def _past_send_deadline(job: _Job, ctx: SendContext) -> bool:
    now = ctx.clock()
    return _past_deadline(job.created_at or now, job.send_at, now=now, deadline_s=ctx.settings.send_deadline_s)


def _past_deadline(created_at: datetime, send_at: datetime | None, *, now: datetime, deadline_s: float) -> bool:
    """Whether ``send_deadline_s`` has passed since the notification became due (stored, or its send_at)."""
    due = max(created_at, send_at) if send_at is not None else created_at
    return now - due > timedelta(seconds=deadline_s)


def _forgotten(error: ApiError, job: _Job, ctx: SendContext) -> SendResult | None:
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


def _after_failed_create(error: ApiError, job: _Job, ctx: SendContext) -> SendResult:
    decision = _decide(error, job, ctx)
    if decision.kind is DecisionKind.PAUSE_WORKSPACE:  # refused or never connected: nothing was sent
        return _pause_workspace(decision, job.notification_id, job, ctx)
    if error.ambiguous:
        # It may exist: the next run looks before it sends (state unknown skips the lease wait). The
        # policy never gives up blind on an ambiguous write: its answer here is "look first".
        with ctx.sessions.begin() as session:
            moves.mark_unknown(session, attempt_id=job.attempt_id, seen_claims=job.claims, now=ctx.clock(),
                               no_resend=None if decision.resend_allowed else (decision.error_kind, decision.reason))
    elif decision.kind is not DecisionKind.GIVE_UP:
        _release(job, ctx)
    return _apply(decision, job, ctx)


def _apply(decision: Decision, job: _Job, ctx: SendContext) -> SendResult:
    if decision.kind is DecisionKind.PAUSE_WORKSPACE:
        return _pause_workspace(decision, job.notification_id, job, ctx)
    if decision.pause_s > 0:
        pause_after_429(ctx.limiter, decision.pause_s)
    if decision.kind is DecisionKind.GIVE_UP:
        return _fail(job, ctx, decision.error_kind, decision.reason)
    return SendResult(Outcome.RETRY, decision.reason, delay_s=decision.delay_s, deferred=decision.deferred)


def _release(job: _Job, ctx: SendContext) -> bool:
    with ctx.sessions.begin() as session:
        return moves.release(session, attempt_id=job.attempt_id, seen_claims=job.claims, now=ctx.clock())


def _record_acceptance(job: _Job, ctx: SendContext, message: Message, outcome: Outcome) -> SendResult:
    now = ctx.clock()
    reported = attempt_state_from_status(message.status.value if message.status else None)
    # A message that has already failed when we record it (a recovered send whose failure webhook
    # came before we knew its ID) is recorded as sent; its failure is then applied like any
    # outcome below, so the single fallback decision is made.
    state = AttemptState.SENT if reported is AttemptState.FAILED else reported
    with ctx.sessions.begin() as session:
        accepted = moves.accept(session, notification_id=job.notification_id, attempt_id=job.attempt_id,
                                message_id=message.id, state=state, now=now,
                                next_read_at=next_read_at(state=state, reports_read=reports_read(job.route.channel.value),
                                                          accepted_at=now, now=now, plan=readback_plan_of(ctx.settings)),
                                without_waiting=True)  # lost in a database crash? recovery adopts the message again
        if accepted is None:
            return SendResult(Outcome.SKIPPED, "the attempt was recorded by another worker")
        # An adopted message may already be delivered or read (its reports came while its send
        # was unrecorded, and no later report will drop the content): no other attempt can be
        # needed any more, as when the consumer applies delivered.
        if job.drops_payload_on_acceptance or state in (AttemptState.DELIVERED, AttemptState.READ):
            store.drop_payload(session, job.notification_id)
    if reported is AttemptState.FAILED:
        tracking.apply_outcome(tracking.Outcome(message.id, "failed", message.external_error), ctx, ctx.enqueuer)
    if job.created_at is not None:
        metrics.SEND_LATENCY.observe(max((now - job.created_at).total_seconds(), 0.0))
    return SendResult(outcome, message_id=message.id)


def _fail(job: _Job, ctx: SendContext, error_kind: str, detail: str, *, looked: bool = False) -> SendResult:
    """End the attempt as failed with the error recorded; the first attempt's failure then gets
    the single fallback decision, the fallback's ends the notification.

    Out of tries, an attempt that an earlier run claimed looks first (one read, as after an
    ambiguous write): that run's message may exist (it died before recording it), and a fallback
    is for a message that does not exist or failed, never for one that may be delivered."""
    if error_kind == TRIES_EXHAUSTED and not looked and (found := _look_for_earlier_message(job, ctx)) is not None:
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
