"""Records of the in-memory workspace and the two domain errors the routes translate to statuses.

Plain dataclasses: the store (state.py) owns and mutates them; shapes.py turns them into JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MESSAGE_INCOMING, MESSAGE_OUTGOING, MESSAGE_ACTIVITY, MESSAGE_TEMPLATE = 0, 1, 2, 3
MESSAGE_TYPE_NAMES = {0: "incoming", 1: "outgoing", 2: "activity", 3: "template"}


class NotFound(Exception):
    """An account-scoped resource does not exist (answered 404)."""


class Unprocessable(Exception):
    """A request that parsed but cannot be carried out (answered 422, or ``status``)."""

    def __init__(self, message: str, *, attributes: Iterable[str] = (), status: int = 422) -> None:
        super().__init__(message)
        self.attributes = list(attributes)
        self.status = status


@dataclass
class ContactRec:
    id: int
    account_id: int
    name: str | None
    phone_number: str | None
    email: str | None
    identifier: str | None
    additional_attributes: dict[str, Any]
    created_at: float
    # The channels' own opt-outs: the SMS provider refuses a number that replied STOP (21610) until
    # START; the platform refuses marketing templates to a user who stopped them (131050).
    sms_opted_out: bool = False
    marketing_opted_out: bool = False


@dataclass
class ContactInboxRec:
    id: int
    contact_id: int
    inbox_id: int
    source_id: str
    created_at: float


@dataclass
class ConversationRec:
    id: int
    display_id: int
    uuid: str
    account_id: int
    inbox_id: int
    contact_id: int
    contact_inbox_id: int
    status: str
    custom_attributes: dict[str, Any]
    additional_attributes: dict[str, Any]
    created_at: float
    last_activity_at: float
    message_ids: list[int] = field(default_factory=list)


@dataclass
class MessageRec:
    id: int
    account_id: int
    inbox_id: int
    conversation_id: int  # internal id
    contact_id: int
    content: str | None
    message_type: int
    private: bool
    source_id: str | None
    status: str | None
    created_at: float
    template_params: dict[str, Any] | None = None
    content_attributes: dict[str, Any] = field(default_factory=dict)
    additional_attributes: dict[str, Any] = field(default_factory=dict)
    dispatched: bool = True
    updated_at: float = 0.0
    plan_effect: str = "hold"  # what the channel does with it (channels.Plan), kept for a restart
    plan_error: str | None = None
    # The furthest delivery status it reached (sent < delivered < read), whatever a late callback
    # stored after it: what its recipient really got. Only the inspection endpoint shows it.
    highest_status: str | None = None

    @property
    def external_error(self) -> str | None:
        return self.content_attributes.get("external_error")


@dataclass
class WebhookRec:
    id: int
    account_id: int
    name: str | None
    url: str
    inbox_id: int | None
    subscriptions: list[str]
    secret: str
