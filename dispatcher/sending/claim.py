"""Claim: read what a send needs and take the attempt for this run.

One statement (two on SQLite) reads the notification and its current attempt (made on its first
run) and counts the run; the claim guards them (still to be sent, not dying in a loop, a readable
payload). On the warm path, with inbox,
contact, source_id and conversation all known, the same transaction marks the attempt in flight;
the claim statement refuses a recipient who said no. The slow path claims once the call step
has resolved the target (:func:`claim_resolved`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from dispatcher import metrics
from dispatcher.context import SendContext
from dispatcher.errors import InvalidEvent
from dispatcher.lifecycle import moves
from dispatcher.lifecycle.states import (
    SENDABLE_ATTEMPT_STATES,
    SENDABLE_NOTIFICATION_STATES,
    AttemptPurpose,
    AttemptState,
)
from dispatcher.policy.channels import window_open as service_window_open
from dispatcher.queues import Priority
from dispatcher.recipients.keys import contact_keys, keys_of_contact
from dispatcher.recipients.policy import needs_consent
from dispatcher.sending import prepare, record
from dispatcher.sending.job import MessageBody, Outcome, OwedDecision, SendJob, SendResult, Target, current_attempt
from dispatcher.store import queries as store
from dispatcher.store.suppressions import Blocked, blocking_reason, refusal_clause

log = logging.getLogger(__name__)


def claim(notification_id: int, ctx: SendContext) -> SendJob | SendResult | OwedDecision:
    """Read what the send needs; on the warm path (everything known), also mark it in flight.

    On PostgreSQL its statements run outside a transaction block, each its own transaction (no
    BEGIN, no COMMIT: a warm claim is 2 round trips, the load with the run's count and the cached
    target, then the claim). Each write among them is one guarded statement: the attempt's upsert
    (the run counted before it does anything, with the load) and the claim, a
    compare-and-set on the claims this run read, with the opt-out check inside it; a write of
    several statements (set aside, a refusal) takes a transaction of its own (:func:`_writing`).
    SQLite runs them all in one transaction, as before (BEGIN IMMEDIATE serialises its writers)."""
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        alone = moves.each_statement_alone(session)
        loaded = moves.load_and_count_run(session, notification_id=notification_id, channels=_channels(ctx),
                                          inboxes=_inboxes(ctx), account=ctx.settings.account, now=now)
        notification, attempt = loaded.notification, loaded.attempt
        if notification is None:
            return SendResult(Outcome.SKIPPED, "no such notification")
        if notification.state not in SENDABLE_NOTIFICATION_STATES:
            return SendResult(Outcome.SKIPPED, f"notification is {notification.state}")
        number, route_name, purpose = current_attempt(notification)
        route = ctx.settings.routes.get(route_name)
        if route is None:  # handed over for a route since removed: set aside, or the sweep would hand it over forever
            with _writing(session, ctx, alone=alone) as writes:
                return set_aside_unconfigured_route(writes, notification.id, route_name, now=now)
        if attempt is None:  # the load and the count disagree with the checks above: a bug, said plainly
            raise RuntimeError(f"notification {notification_id}: its run was not counted although it is to be sent")
        if attempt.state == AttemptState.FAILED:
            return OwedDecision(number)
        if attempt.state not in SENDABLE_ATTEMPT_STATES:
            return SendResult(Outcome.SKIPPED, f"attempt {number} is {attempt.state}")
        if attempt.runs > ctx.settings.send_max_runs:
            with _writing(session, ctx, alone=alone) as writes:
                return _set_aside(writes, notification.id, number, attempt.runs - 1, now=now)
        payload, unreadable = prepare.payload_of(notification.body)
        job = SendJob(
            notification_id=notification.id,
            attempt_id=attempt.id,
            attempt_number=number,
            purpose=purpose,
            attempt_state=AttemptState(attempt.state),
            route_name=route_name,
            route=route,
            tries=attempt.tries,
            payload=payload,
            drops_payload_on_acceptance=prepare.last_possible_attempt(purpose, notification.fallback_route, payload),
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
            # looked for first, in send._send). In quiet hours nothing starts: send._send waits.
            if job.tries < ctx.plan.max_tries and prepare.window_opening(job, ctx.settings, now=now) is None:
                job = _start_if_known(session, job, ctx, loaded, now=now)
            if job.started is None and (blocked := said_no(session, job, ctx)) is not None:
                with _writing(session, ctx, alone=alone) as writes:
                    refused = end_refused(writes, job, blocked, now=now)
                    if refused.outcome is Outcome.SKIPPED:  # lost a race to another worker: no crash
                        moves.end_run(writes, attempt_id=job.attempt_id)
                return refused
        if job.started is None:
            store.touch_for_run(session, job.notification_id, now=now)
    if unreadable:
        return record.fail(job, ctx, "payload_unreadable", "the notification's stored payload cannot be read")
    if payload is None:
        return record.fail(job, ctx, "payload_missing", "the notification's payload is gone")
    return job


def _channels(ctx: SendContext) -> dict[str, str]:
    """The configured routes and their channels: the routes whose attempts may run."""
    return {name: route.channel.value for name, route in ctx.settings.routes.items()}


def _inboxes(ctx: SendContext) -> dict[str, int]:
    """The routes whose inbox this process knows, and that inbox's ID: the load reads the cached
    target for the route's inbox with the notification (no call, no statement of its own)."""
    return {name: inbox.id for name, route in ctx.settings.routes.items()
            if (inbox := ctx.inboxes.cached(route)) is not None}


@contextlib.contextmanager
def _writing(session: Session, ctx: SendContext, *, alone: bool) -> Iterator[Session]:
    """Where a write of several statements goes: the claim's own transaction, or, when the claim's
    statements run alone (PostgreSQL), a transaction of its own."""
    if not alone:
        yield session
        return
    with ctx.sessions.begin() as writes:
        yield writes


def _start_if_known(session: Session, job: SendJob, ctx: SendContext, loaded: moves.LoadedRun, *,
                    now: datetime) -> SendJob:
    """The warm path: with inbox, contact, source_id and conversation all known, mark the
    attempt in flight in the loading transaction itself (one commit before createMessage). The
    cached target is the one the load read with the notification, for this inbox; else (SQLite, a
    payload stored before its keys were) it is read here, a statement of its own."""
    inbox = ctx.inboxes.cached(job.route)
    if inbox is None:
        return job
    known = loaded.target if loaded.target_inbox_id == inbox.id else None
    if known is None:
        known = store.cached_target(session, account=ctx.settings.account,
                                    keys=contact_keys(job.contact, key=ctx.settings.hashing_key), inbox_id=inbox.id)
    window = service_window_open(known.last_incoming_at, now=now)
    if known.contact_id is None or known.source_id is None or known.conversation_id is None:
        return job
    target = Target(inbox_id=inbox.id, contact_id=known.contact_id, conversation_id=known.conversation_id,
                    window_open=window)
    try:
        body = prepare.message_body(job, ctx.settings, window_open=window)
    except InvalidEvent:
        return job  # the slow path fails it with the error recorded
    if not claim_attempt(session, job, ctx, target, body, now=now):
        return job
    return replace(job, started=target, body=body, claims=job.claims + 1)  # its own claim: the attempt is this run's


def refuse_if_said_no(session: Session, job: SendJob, ctx: SendContext, *, now: datetime) -> SendResult | None:
    """The recipient opted out of this channel and category, or the route needs consent that is
    not recorded: end the notification (no call, no fallback) in the caller's transaction, the
    one that would claim the attempt. None: the send may go on."""
    blocked = said_no(session, job, ctx)
    return end_refused(session, job, blocked, now=now) if blocked is not None else None


def said_no(session: Session, job: SendJob, ctx: SendContext) -> Blocked | None:
    """Why the recipient may not be messaged on this route (opted out, or no consent where the
    route needs it); None: the send may go on. A read only."""
    return blocking_reason(session, account=ctx.settings.account,
                           keys=keys_of_contact(job.contact, key=ctx.settings.hashing_key),
                           channel=job.route.channel.value, category=job.category,
                           needs_consent=needs_consent(job.route, ctx.settings))


def end_refused(session: Session, job: SendJob, blocked: Blocked, *, now: datetime) -> SendResult:
    """End the notification for a recipient who said no, and drop its content: nothing more will be
    sent. Its statements belong in one transaction (the caller's)."""
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


def claim_attempt(
    session: Session, job: SendJob, ctx: SendContext, target: Target, body: MessageBody, *, now: datetime
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


def set_aside_unconfigured_route(session: Session, notification_id: int, route_name: str, *,
                                 now: datetime) -> SendResult:
    """The current attempt's route is no longer configured: no inbox to send it on, and no other
    route may stand in (the host chose this one). Set it aside, saying which, until the route is
    configured again and an operator runs ``dispatcher retry``; nothing is failed, nothing falls back."""
    detail = f"its route {route_name!r} is not configured; set aside until it is and `dispatcher retry`"
    if not moves.set_aside(session, notification_id=notification_id, detail=detail, now=now,
                           error_kind=moves.ROUTE_UNCONFIGURED):
        return SendResult(Outcome.SKIPPED, "the notification moved on since this run read it")
    log.error("notification %s set aside: %s", notification_id, moves.ROUTE_UNCONFIGURED)
    return SendResult(Outcome.SET_ASIDE, f"{moves.ROUTE_UNCONFIGURED}: {detail}")


def claim_resolved(job: SendJob, ctx: SendContext, target: Target, body: MessageBody) -> SendJob | SendResult:
    """The slow path's claim, once the target is resolved: the attempt marked in flight for it, the
    job with its own claim counted. The claim refuses a recipient who said no while this run looked
    the contact up; then the same transaction ends the notification, saying why."""
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        taken = claim_attempt(session, job, ctx, target, body, now=now)
        blocked = None if taken else refuse_if_said_no(session, job, ctx, now=now)
    if blocked is not None:
        return blocked
    if not taken:
        return SendResult(Outcome.SKIPPED, "another worker claimed the attempt since this run read it")
    return replace(job, claims=job.claims + 1)  # its own claim: the attempt is this run's
