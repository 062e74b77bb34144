"""What the dispatcher tells a host about a notification: ``dispatcher status`` and ``notify()``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from dispatcher.store.models import Attempt, Notification


class AttemptRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    number: int
    purpose: str  # first, template (a resend as the approved template after 131047) or fallback
    route: str
    channel: str
    state: str
    inbox_id: int | None
    conversation_id: int | None
    message_id: int | None
    accepted_at: datetime | None
    error_kind: str | None
    error_detail: str | None
    tries: int


class NotificationRecord(BaseModel):
    """The contract's recommended per-send values, and the attempts behind them."""

    model_config = ConfigDict(frozen=True)

    event_id: str
    state: str
    route: str
    fallback_route: str | None
    priority: str  # urgent or normal: its lane (docs/priorities.md)
    channel: str | None
    inbox_id: int | None
    message_id: int | None
    conversation_id: int | None
    accepted_at: datetime | None
    delivery_state: str | None
    error_kind: str | None
    error_detail: str | None
    fallback_decision: str | None
    fallback_reason: str | None
    send_at: datetime | None
    created_at: datetime
    updated_at: datetime
    attempts: list[AttemptRecord]

    @classmethod
    def of(cls, notification: Notification, attempts: list[Attempt]) -> NotificationRecord:
        return cls(
            event_id=notification.event_id,
            state=notification.state,
            route=notification.route,
            fallback_route=notification.fallback_route,
            priority=notification.priority,
            channel=notification.channel,
            inbox_id=notification.inbox_id,
            message_id=notification.message_id,
            conversation_id=notification.conversation_id,
            accepted_at=notification.accepted_at,
            delivery_state=notification.delivery_state,
            error_kind=notification.error_kind,
            error_detail=notification.error_detail,
            fallback_decision=notification.fallback_decision,
            fallback_reason=notification.fallback_reason,
            send_at=notification.send_at,
            created_at=notification.created_at,
            updated_at=notification.updated_at,
            attempts=[
                AttemptRecord(
                    number=attempt.number,
                    purpose=attempt.purpose,
                    route=attempt.route,
                    channel=attempt.channel,
                    state=attempt.state,
                    inbox_id=attempt.inbox_id,
                    conversation_id=attempt.conversation_id,
                    message_id=attempt.message_id,
                    accepted_at=attempt.accepted_at,
                    error_kind=attempt.error_kind,
                    error_detail=attempt.error_detail,
                    tries=attempt.tries,
                )
                for attempt in attempts
            ],
        )


class NotificationSummary(BaseModel):
    """One line of an operator's list: what it is and where it stands, no content or contact data.
    ``cursor`` asks for the page after it (``dispatcher list --before``)."""

    model_config = ConfigDict(frozen=True)

    cursor: int
    event_id: str
    workspace: str
    state: str
    route: str
    channel: str | None
    message_id: int | None
    error_kind: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, notification: Notification) -> NotificationSummary:
        return cls(cursor=notification.id, event_id=notification.event_id, workspace=notification.workspace,
                   state=notification.state, route=notification.route, channel=notification.channel,
                   message_id=notification.message_id, error_kind=notification.error_kind,
                   created_at=notification.created_at, updated_at=notification.updated_at)
