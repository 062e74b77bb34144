"""Request bodies of the contract's write operations, validated as strictly as the contract states.

Strict JSON types (``"1"`` is not an integer, ``null`` is not a string), extra keys allowed (the real
service accepts more than the contract shows, e.g. ``message`` on createConversation and ``source_id``
on createMessage). A violation answers 422; the answer names fields, never echoes values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

WEBHOOK_EVENTS = (
    "conversation_created",
    "conversation_status_changed",
    "conversation_updated",
    "message_created",
    "message_updated",
    "contact_created",
    "contact_updated",
)
E164 = re.compile(r"^\+[1-9]\d{1,14}$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
URL = re.compile(r"^https?://[^\s/?#]+(?:[/?#]\S*)?$", re.IGNORECASE)


class Body(BaseModel):
    """Base: strict types, open to extra keys, and an explicit ``null`` is refused for typed fields."""

    model_config = ConfigDict(strict=True, extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _refuse_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in cls.model_fields:
                if name in data and data[name] is None:
                    raise ValueError(f"{name} must not be null")
        return data


class ContactCreate(Body):
    inbox_id: int
    name: str | None = None
    phone_number: str | None = None
    email: str | None = None
    identifier: str | None = None
    additional_attributes: dict[str, Any] | None = None

    @field_validator("phone_number")
    @classmethod
    def _e164(cls, value: str | None) -> str | None:
        if value is not None and value != "" and not E164.match(value):
            raise ValueError("phone_number must be in E.164 format")
        return value or None

    @field_validator("email")
    @classmethod
    def _email(cls, value: str | None) -> str | None:
        if value is not None and value != "" and not EMAIL.match(value):
            raise ValueError("email is invalid")
        return value or None


class TemplateParams(Body):
    name: str
    category: Literal["UTILITY", "MARKETING", "AUTHENTICATION"]
    language: str
    processed_params: dict[str, Any]


class LegacyTemplateParams(TemplateParams):
    """Inside createConversation's ``message``, outside the contract: any category is accepted,
    as in the maintainers' legacy example (``SHIPPING_UPDATE``)."""

    category: str  # type: ignore[assignment]


class MessageCreate(Body):
    content: str
    message_type: Literal["outgoing", "incoming"] = "outgoing"
    private: bool = False
    template_params: TemplateParams | None = None
    source_id: str | None = None  # field notes: set, the message is stored but never sent


class InitialMessage(MessageCreate):
    template_params: LegacyTemplateParams | None = None


class ConversationCreate(Body):
    source_id: str
    inbox_id: int | None = None
    contact_id: int | None = None
    status: Literal["open", "resolved", "pending"] = "open"
    custom_attributes: dict[str, Any] | None = None
    additional_attributes: dict[str, Any] | None = None
    message: InitialMessage | None = None


class WebhookSpec(Body):
    name: str | None = None
    url: str
    inbox_id: int | None = None
    subscriptions: Annotated[list[Literal[WEBHOOK_EVENTS]], Field(min_length=1)]  # type: ignore[valid-type]

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not URL.match(value):
            raise ValueError("url must be an http(s) URL")
        return value


class WebhookCreate(Body):
    webhook: WebhookSpec


class OptOuts(Body):
    """``POST /_sandbox/opt-outs``: set a contact's opt-outs as the channels hold them (the SMS
    provider's STOP list, the platform's "stop marketing"); a field left out is left as it is."""

    account_id: int = 1
    contact_id: int
    sms_opted_out: bool | None = None
    marketing_opted_out: bool | None = None


class RevokeToken(Body):
    """``POST /_sandbox/tokens/revoke``: the workspace's admin revokes an API access token (it
    answers 401 from then on, as a revoked or regenerated token does)."""

    token: str = Field(min_length=1)


class Incoming(Body):
    """``POST /_sandbox/incoming``: a customer's message, ``age_s`` seconds ago, in a conversation
    (its display id) or on a contact/inbox pair."""

    account_id: int = 1
    contact_id: int | None = None
    inbox_id: int | None = None
    conversation_id: int | None = None
    content: str = "Hello"
    age_s: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _where(self) -> Incoming:
        if self.conversation_id is None and (self.contact_id is None or self.inbox_id is None):
            raise ValueError("give conversation_id, or contact_id and inbox_id")
        return self


def describe_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Field path and reason only: values may be phone numbers or health data."""
    return [{"field": ".".join(str(p) for p in err.get("loc", ())) or "body", "reason": err.get("msg", "")} for err in errors]
