"""The send path: one notification's current attempt, from the store to an accepted message.

At least once: the task that runs this may run again after a crash, a redelivery or a sweep.
At most one message: every transition is a compare-and-set; before createMessage the attempt is
marked in flight under a lease, and an attempt left in flight or unknown is first looked for in
the conversation (:mod:`dispatcher.recover`) and adopted, never blindly sent again.

Steps, as the contract orders them: load and guard; recover an ambiguous earlier try; choose the
inbox, find or create the contact, its source_id and the conversation (:mod:`dispatcher.resolve`);
apply the channel rules; take a limiter slot, mark in flight, call createMessage; record the
message ID and status. No Celery here: the caller turns a :class:`SendResult` into a retry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from dispatcher import store
from dispatcher.api import ApiError, Message
from dispatcher.context import SendContext
from dispatcher.errors import InvalidEvent
from dispatcher.models import Attempt, Notification
from dispatcher.policy.channels import MessageKind, choose_message_kind, template_params
from dispatcher.policy.ratelimit import route_bucket
from dispatcher.policy.retry import Decision, DecisionKind, decide
from dispatcher.recover import find_sent_message
from dispatcher.resolve import NotContactable, Wait, call_api, resolve_contact, resolve_conversation, resolve_source_id
from dispatcher.settings import Route
from dispatcher.states import (
    AttemptState,
    NotificationState,
    SENDABLE_ATTEMPT_STATES,
    attempt_state_from_status,
    notification_state_for,
)

log = logging.getLogger(__name__)

SENDABLE_NOTIFICATION_STATES = (NotificationState.QUEUED, NotificationState.SENDING, NotificationState.FALLING_BACK)


class Outcome(StrEnum):
    ACCEPTED = "accepted"  # createMessage answered: the message exists
    ADOPTED = "adopted"  # an earlier, ambiguous try had sent it: found and recorded
    FAILED = "failed"  # the attempt ended without a message
    SKIPPED = "skipped"  # nothing to do (already done, not due, or another worker holds it)
    RETRY = "retry"  # try again after delay_s


@dataclass(frozen=True)
class SendResult:
    outcome: Outcome
    reason: str = ""
    delay_s: float = 0.0
    deferred: bool = False  # the wait is long: keep it as a due time, not a broker countdown
    message_id: int | None = None


@dataclass(frozen=True)
class _Job:
    """What the send needs from the database, read in one short transaction."""

    notification_id: int
    attempt_id: int
    attempt_number: int
    attempt_state: AttemptState
    route_name: str
    route: Route
    tries: int
    payload: dict[str, Any]
    drops_payload_on_acceptance: bool
    lease_active_s: float
    conversation_id: int | None
    content_hash: str | None
    in_flight_since: Any


def send_notification(notification_id: int, ctx: SendContext) -> SendResult:
    """Bring the notification's current attempt one step nearer an accepted message."""
    job_or_result = _load(notification_id, ctx)
    if isinstance(job_or_result, SendResult):
        return job_or_result
    job = job_or_result
    try:
        return _send(job, ctx)
    except Wait as wait:
        return SendResult(Outcome.RETRY, wait.reason, delay_s=wait.delay_s)
    except NotContactable as error:
        return _fail(job, ctx, "not_contactable", str(error))
    except InvalidEvent as error:
        return _fail(job, ctx, "invalid_for_channel", str(error))
    except ApiError as error:  # a step before createMessage: nothing was sent by this try
        return _apply(decide(error, tries=job.tries, plan=ctx.plan, rng=ctx.rng), job, ctx)


def _load(notification_id: int, ctx: SendContext) -> _Job | SendResult:
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        notification = store.load_notification(session, notification_id)
        if notification is None:
            return SendResult(Outcome.SKIPPED, "no such notification")
        if notification.state not in SENDABLE_NOTIFICATION_STATES:
            return SendResult(Outcome.SKIPPED, f"notification is {notification.state}")
        number, route_name = _current_route(notification)
        route = ctx.settings.routes.get(route_name)
        if route is None:
            return SendResult(Outcome.SKIPPED, f"route {route_name!r} is no longer configured")
        attempt = store.ensure_attempt(
            session, notification_id=notification.id, number=number, route=route_name, channel=route.channel.value
        )
        if attempt.state not in SENDABLE_ATTEMPT_STATES:
            return SendResult(Outcome.SKIPPED, f"attempt {number} is {attempt.state}")
        payload = store.load_payload(session, notification.id)
        tries = store.count_try(session, attempt.id)
        store.touch_for_run(session, notification.id, now=now)
        lease_active_s = (attempt.lease_until - now).total_seconds() if attempt.lease_until else 0.0
        job = _Job(
            notification_id=notification.id,
            attempt_id=attempt.id,
            attempt_number=number,
            attempt_state=AttemptState(attempt.state),
            route_name=route_name,
            route=route,
            tries=tries,
            payload=payload or {},
            drops_payload_on_acceptance=number == 2 or notification.fallback_route is None,
            lease_active_s=lease_active_s,
            conversation_id=attempt.conversation_id,
            content_hash=attempt.content_hash,
            in_flight_since=attempt.in_flight_since,
        )
    if payload is None:
        return _fail(job, ctx, "payload_missing", "the notification's payload is gone")
    return job


def _current_route(notification: Notification) -> tuple[int, str]:
    if notification.fallback_decision == "fallback" and notification.fallback_route:
        return 2, notification.fallback_route
    return 1, notification.route


def _send(job: _Job, ctx: SendContext) -> SendResult:
    if job.attempt_state is AttemptState.IN_FLIGHT and job.lease_active_s > 0:
        return SendResult(Outcome.RETRY, "another worker's createMessage may still be running", delay_s=job.lease_active_s + 1)
    resend_allowed = True
    if job.attempt_state in (AttemptState.IN_FLIGHT, AttemptState.UNKNOWN):
        adopted = _recover(job, ctx)
        if adopted is not None:
            return adopted
        resend_allowed = job.tries <= ctx.plan.max_tries
    if not resend_allowed or job.tries > ctx.plan.max_tries:
        return _fail(job, ctx, "tries_exhausted", f"{job.tries - 1} tries used")

    inbox = ctx.inboxes.resolve(job.route)
    if inbox is None:
        return _fail(job, ctx, "inbox_not_found", f"route {job.route_name!r} names no inbox of the workspace")
    contact = job.payload["contact"]
    contact_id, returned_source_id = resolve_contact(ctx, contact, inbox_id=inbox.id)
    source_id = resolve_source_id(ctx, contact_id=contact_id, inbox_id=inbox.id, returned=returned_source_id)
    conversation_id = resolve_conversation(ctx, contact_id=contact_id, inbox_id=inbox.id, source_id=source_id)
    body = _message_body(job, ctx, contact_id=contact_id, inbox_id=inbox.id)

    buckets = (route_bucket(job.route_name),) if job.route.max_per_minute is not None else ()
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        taken = store.start_send(
            session,
            job.attempt_id,
            now=now,
            lease_until=now + timedelta(seconds=ctx.settings.send_lease_s),
            values={
                "inbox_id": inbox.id,
                "contact_id": contact_id,
                "conversation_id": conversation_id,
                "content_hash": store.content_hash(body["content"]),
            },
        )
        if taken:
            store.set_notification_state(
                session,
                job.notification_id,
                expected=SENDABLE_NOTIFICATION_STATES,
                values={"state": _sending_state(job), "inbox_id": inbox.id, "channel": job.route.channel.value,
                        "conversation_id": conversation_id, "updated_at": now},
            )
    if not taken:
        return SendResult(Outcome.SKIPPED, "another worker holds the attempt")
    try:
        message = call_api(ctx, lambda: ctx.api.create_message(conversation_id, **body), *buckets)
    except Wait:
        _set_attempt(job, ctx, expected=(AttemptState.IN_FLIGHT,), values={"state": AttemptState.QUEUED, "lease_until": None})
        raise
    except ApiError as error:
        return _after_failed_create(error, job, ctx)
    return _record_acceptance(job, ctx, message, Outcome.ACCEPTED)


def _sending_state(job: _Job) -> NotificationState:
    return NotificationState.FALLING_BACK if job.attempt_number == 2 else NotificationState.SENDING


def _message_body(job: _Job, ctx: SendContext, *, contact_id: int, inbox_id: int) -> dict[str, Any]:
    template = job.payload.get("template")
    with ctx.sessions() as session:
        window = store.window_open(
            session, account_id=ctx.settings.account_id, contact_id=contact_id, inbox_id=inbox_id, now=ctx.clock()
        )
    kind = choose_message_kind(
        channel=job.route.channel,
        template_required=job.route.template_required,
        window_open=window,
        has_template=template is not None,
    )
    body: dict[str, Any] = {"content": job.payload["content"]}
    if kind is MessageKind.TEMPLATE:
        registered = ctx.settings.template(template["name"], template["language"])
        if registered is None:
            raise InvalidEvent("template.name", "is no longer in the template registry")
        body["template_params"] = template_params(registered, template["params"])
    return body


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


def _after_failed_create(error: ApiError, job: _Job, ctx: SendContext) -> SendResult:
    decision = decide(error, tries=job.tries, plan=ctx.plan, rng=ctx.rng)
    if error.ambiguous:
        # It may exist: the next run looks before it sends (state unknown skips the lease wait).
        _set_attempt(job, ctx, expected=(AttemptState.IN_FLIGHT,), values={"state": AttemptState.UNKNOWN, "lease_until": None})
        if decision.kind is DecisionKind.GIVE_UP:
            decision = Decision(DecisionKind.CHECK_THEN_RETRY, 1.0, decision.reason, decision.error_kind, resend_allowed=False)
    elif decision.kind is not DecisionKind.GIVE_UP:
        _set_attempt(job, ctx, expected=(AttemptState.IN_FLIGHT,), values={"state": AttemptState.QUEUED, "lease_until": None})
    return _apply(decision, job, ctx)


def _apply(decision: Decision, job: _Job, ctx: SendContext) -> SendResult:
    if decision.pause_s > 0:
        ctx.limiter.pause(decision.pause_s)
    if decision.kind is DecisionKind.GIVE_UP:
        return _fail(job, ctx, decision.error_kind, decision.reason)
    return SendResult(Outcome.RETRY, decision.reason, delay_s=decision.delay_s, deferred=decision.deferred)


def _set_attempt(job: _Job, ctx: SendContext, *, expected: tuple[AttemptState, ...], values: dict[str, Any]) -> bool:
    with ctx.sessions.begin() as session:
        return store.update_attempt(session, job.attempt_id, expected=expected, values=values)


def _record_acceptance(job: _Job, ctx: SendContext, message: Message, outcome: Outcome) -> SendResult:
    now = ctx.clock()
    state = attempt_state_from_status(message.status.value if message.status else None)
    with ctx.sessions.begin() as session:
        moved = store.update_attempt(
            session,
            job.attempt_id,
            expected=(AttemptState.QUEUED, AttemptState.IN_FLIGHT, AttemptState.UNKNOWN),
            values={"state": state, "message_id": message.id, "accepted_at": now, "status_at": now,
                    "content_hash": None, "lease_until": None, "error_kind": None, "error_detail": None},
        )
        if not moved:
            return SendResult(Outcome.SKIPPED, "the attempt was recorded by another worker")
        attempt = session.get(Attempt, job.attempt_id)
        assert attempt is not None
        store.set_notification_state(
            session,
            job.notification_id,
            expected=SENDABLE_NOTIFICATION_STATES,
            values={"state": notification_state_for(state), "message_id": message.id,
                    "conversation_id": attempt.conversation_id, "inbox_id": attempt.inbox_id,
                    "channel": attempt.channel, "accepted_at": now, "delivery_state": state.value,
                    "error_kind": None, "error_detail": None, "updated_at": now},
        )
        if job.drops_payload_on_acceptance:
            store.drop_payload(session, job.notification_id)
    return SendResult(outcome, message_id=message.id)


def _fail(job: _Job, ctx: SendContext, error_kind: str, detail: str) -> SendResult:
    """End the attempt as failed with the error recorded; nothing more is sent for it."""
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        moved = store.update_attempt(
            session,
            job.attempt_id,
            expected=tuple(SENDABLE_ATTEMPT_STATES),
            values={"state": AttemptState.FAILED, "error_kind": error_kind, "error_detail": detail[:200],
                    "lease_until": None, "status_at": now},
        )
        if moved:
            store.set_notification_state(
                session,
                job.notification_id,
                expected=SENDABLE_NOTIFICATION_STATES,
                values={"state": NotificationState.FAILED, "delivery_state": AttemptState.FAILED.value,
                        "error_kind": error_kind, "error_detail": detail[:200], "updated_at": now},
            )
            store.drop_payload(session, job.notification_id)
    log.warning("attempt %s of notification %s failed: %s", job.attempt_number, job.notification_id, error_kind)
    return SendResult(Outcome.FAILED, f"{error_kind}: {detail}")
