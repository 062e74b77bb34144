"""The send path's records: the job a claim hands on (:class:`SendJob`), where its message goes
(:class:`Target`), the message's body, and what a run ends with (:class:`SendResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from dispatcher.intake.request import ContactDetails, SendPayload
from dispatcher.lifecycle.states import AttemptPurpose, AttemptState
from dispatcher.settings import Route

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
class Target:
    """Where the message goes: everything createMessage needs besides the body."""

    inbox_id: int
    contact_id: int
    conversation_id: int
    window_open: bool


@dataclass(frozen=True)
class SendJob:
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
    started: Target | None = None  # the warm path: already marked in flight, send at once
    body: MessageBody | None = None

    @property
    def contact(self) -> ContactDetails:
        assert self.payload is not None  # claim.claim fails a job without one before any step runs
        return self.payload.contact


@dataclass(frozen=True)
class MessageBody:
    """createMessage's body: the content, and the template's parameters when it goes as a template."""

    content: str = field(repr=False)
    template_params: dict[str, Any] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class OwedDecision:
    """The current attempt failed and its notification is still to be sent: its decision is owed."""

    number: int


def current_attempt(row: Any) -> tuple[int, str, AttemptPurpose]:
    """The notification's current attempt: its number, route and purpose. Its row exists once made
    (the template resend and the fallback are made by the move that decides them); the first
    attempt's is made by its first run, through the notification's route."""
    if row.attempt_route is None:
        return row.current_attempt, row.route, AttemptPurpose.FIRST
    return row.current_attempt, row.attempt_route, AttemptPurpose(row.attempt_purpose)
