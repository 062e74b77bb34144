"""Prepare: what the send decides without asking anyone (no store, no call): the message's body
(template or free text, as the channel and the customer-service window allow), whether the
route's quiet hours hold it, whether the send deadline has passed, what the stored payload says."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from dispatcher.errors import InvalidEvent
from dispatcher.intake.request import SendPayload
from dispatcher.lifecycle.states import AFTER_DECISION_PURPOSES, AttemptPurpose
from dispatcher.policy.channels import MessageKind, choose_message_kind, template_params
from dispatcher.policy.quiet_hours import within_window
from dispatcher.sending.job import MessageBody, SendJob
from dispatcher.settings import Routing, Timers


def payload_of(stored: dict[str, Any] | None) -> tuple[SendPayload | None, bool]:
    """The stored payload as its record; and whether one was stored but cannot be read (written
    by another version, or damaged): retrying cannot make it readable."""
    if stored is None:
        return None, False
    try:
        return SendPayload.model_validate(stored), False
    except ValidationError:
        return None, True


def last_possible_attempt(purpose: AttemptPurpose, fallback_route: str | None, payload: SendPayload | None) -> bool:
    """No other attempt can follow this one's acceptance, so its content may go with it: the
    fallback or a retry, or one with no fallback route that no template resend can follow."""
    if purpose in AFTER_DECISION_PURPOSES:
        return True
    may_resend = purpose is AttemptPurpose.FIRST and payload is not None and payload.template is not None
    return fallback_route is None and not may_resend


def message_body(job: SendJob, routing: Routing, *, window_open: bool) -> MessageBody:
    """Template or free text, as the channel and the customer-service window allow."""
    assert job.payload is not None  # claim.claim fails a job without one before any step runs
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
    registered = routing.template(template.name, template.language)
    if registered is None:
        raise InvalidEvent("template.name", "is no longer in the template registry")
    return MessageBody(job.payload.content, template_params(registered, template.params))


def window_opening(job: SendJob, routing: Routing, *, now: datetime) -> datetime | None:
    """When the attempt's route opens its send window, if it is closed now (quiet hours). At intake
    a notification due at night is scheduled for the opening; this holds every later start to the
    window too: a fallback decided at night, a host's retry, a run delayed past the close, a resend
    after an unknown outcome (looked for first, as always)."""
    if job.payload is None or job.route.send_window is None:
        return None
    return within_window(None, job.contact.time_zone, job.route, routing, now=now)


def past_send_deadline(job: SendJob, timers: Timers, *, now: datetime) -> bool:
    return past_deadline(job.created_at or now, job.send_at, now=now, deadline_s=timers.send_deadline_s)


def past_deadline(created_at: datetime, send_at: datetime | None, *, now: datetime, deadline_s: float) -> bool:
    """Whether ``send_deadline_s`` has passed since the notification became due (stored, or its send_at)."""
    due = max(created_at, send_at) if send_at is not None else created_at
    return now - due > timedelta(seconds=deadline_s)
