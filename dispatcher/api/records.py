"""Response records of the workspace API: strict about what we need, tolerant of the rest.

The contract shows most bodies as open objects; the field notes list what a real workspace
(Chatwoot) sends, and older or newer releases wrap the same record differently. Each record
accepts every shape listed there: wrapped in ``payload`` / ``data`` or bare.

Decisions:

* Unknown fields are IGNORED, not kept: records hold only what the dispatcher uses, so
  personal data the service adds (a conversation's sender, a message page's contact) is not
  carried around. Add a field here when a caller needs one.
* Personal data (names, phone numbers, e-mail addresses, content, source IDs, which are phone
  numbers on the business-messaging platform, the webhook URL and error texts) are
  ``repr=False``; the webhook secret is a ``SecretStr``.
* An unknown ``status`` or ``message_type`` reads as None, so one odd message does not make a
  whole page unreadable; None status means "not reported, look again later".
* A page whose list is missing is an error (``UnexpectedResponse`` in the client), never an
  empty page: "no messages" would invite a resend, "no contacts" a duplicate contact.
* ``created_at`` becomes an aware UTC ``datetime`` from unix seconds or an ISO-8601 string.
"""

from __future__ import annotations

import enum
import functools
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, TypeAdapter, model_validator

__all__ = [
    "Contact",
    "ContactCreated",
    "ContactInbox",
    "Conversation",
    "ConversationPage",
    "Inbox",
    "Message",
    "MessagePage",
    "MessageStatus",
    "MessageType",
    "SearchPage",
    "Webhook",
    "parse_list",
]

RecordT = TypeVar("RecordT", bound=BaseModel)


class MessageType(enum.IntEnum):
    """message_type: an integer in API responses, a string in webhook payloads."""

    INCOMING = 0
    OUTGOING = 1
    ACTIVITY = 2
    TEMPLATE = 3


class MessageStatus(enum.StrEnum):
    """Delivery state of one attempt. ``failed`` ends the attempt."""

    SENT = "sent"
    DELIVERED = "delivered"
    READ = "read"
    FAILED = "failed"


def _message_type(value: Any) -> MessageType | None:
    if isinstance(value, MessageType) or value is None:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return MessageType(value) if value in MessageType._value2member_map_ else None
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return _message_type(int(text))
        return MessageType.__members__.get(text.upper())
    return None


def _message_status(value: Any) -> MessageStatus | None:
    if isinstance(value, int) and not isinstance(value, bool):  # the service's enum order
        members = list(MessageStatus)
        return members[value] if 0 <= value < len(members) else None
    if isinstance(value, str):
        try:
            return MessageStatus(value.strip().lower())
        except ValueError:
            return None
    return None


def _as_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _page_number(value: Any) -> Any:
    """current_page may come back as a string ("2"); an empty string means not reported."""
    if isinstance(value, str):
        return int(value.strip()) if value.strip() else None
    return value


def _unwrap(body: Any, *keys: str) -> Any:
    """Descend through wrapper keys (``payload``, ``data`` ...) that are present, in order."""
    for key in keys:
        if isinstance(body, dict) and "id" not in body and key in body:
            body = body[key]
    return body


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Inbox(_Record):
    """A sender channel. ``channel_type`` such as ``Channel::Whatsapp`` or ``Channel::Api``."""

    id: int
    name: str | None = None
    channel_type: str | None = None


class Contact(_Record):
    """A contact. Only ``id`` is certain; the rest is personal data and hidden from repr."""

    id: int
    name: str | None = Field(default=None, repr=False)
    identifier: str | None = Field(default=None, repr=False)
    phone_number: str | None = Field(default=None, repr=False)
    email: str | None = Field(default=None, repr=False)


class ContactInbox(_Record):
    """A contact's binding to one inbox; ``source_id`` is what createConversation needs."""

    source_id: str = Field(repr=False)
    inbox: Inbox | None = None

    @model_validator(mode="before")
    @classmethod
    def _numeric_source_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("source_id"), int):
            return {**data, "source_id": str(data["source_id"])}
        return data


class ContactCreated(_Record):
    """createContact's answer: the contact and, when the service sends it, its inbox binding.

    Accepts ``{"payload": {"contact", "contact_inbox"}}``, ``{"contact", "contact_inbox"}``
    and a bare contact.
    """

    contact: Contact
    contact_inbox: ContactInbox | None = None

    @property
    def source_id(self) -> str | None:
        """The source_id for the inbox the contact was created in, or None if not returned."""
        return self.contact_inbox.source_id if self.contact_inbox else None

    @model_validator(mode="before")
    @classmethod
    def _shapes(cls, data: Any) -> Any:
        data = _unwrap(data, "payload")
        if isinstance(data, dict) and "contact" not in data and "id" in data:
            return {"contact": data, "contact_inbox": data.get("contact_inbox")}
        return data


class Conversation(_Record):
    """A conversation; ``id`` is the account-scoped display id used in paths."""

    id: int
    account_id: int | None = None
    inbox_id: int | None = None
    status: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _shapes(cls, data: Any) -> Any:
        return _unwrap(data, "payload")


class Message(_Record):
    """One message. ``external_error`` is read from the top level or ``content_attributes``."""

    id: int
    content: str | None = Field(default=None, repr=False)
    message_type: Annotated[MessageType | None, BeforeValidator(_message_type)] = None
    status: Annotated[MessageStatus | None, BeforeValidator(_message_status)] = None
    created_at: Annotated[datetime | None, AfterValidator(_as_utc)] = None
    source_id: str | None = Field(default=None, repr=False)
    external_error: str | None = Field(default=None, repr=False)
    conversation_id: int | None = None
    inbox_id: int | None = None
    account_id: int | None = None
    private: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _shapes(cls, data: Any) -> Any:
        data = _unwrap(data, "payload")
        if not isinstance(data, dict):
            return data
        data = dict(data)
        attributes = data.get("content_attributes")
        if not data.get("external_error") and isinstance(attributes, dict):
            data["external_error"] = attributes.get("external_error")
        conversation = data.get("conversation")
        if data.get("conversation_id") is None and isinstance(conversation, dict):
            data["conversation_id"] = conversation.get("id")  # webhook payloads: the display id
        if isinstance(data.get("source_id"), int):
            data["source_id"] = str(data["source_id"])
        return data


class Webhook(_Record):
    """A webhook subscription. ``secret`` (createWebhook only) signs deliveries."""

    id: int
    name: str | None = None
    url: str | None = Field(default=None, repr=False)
    subscriptions: list[str] = Field(default_factory=list)
    inbox_id: int | None = None
    secret: SecretStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _shapes(cls, data: Any) -> Any:
        return _unwrap(data, "payload", "webhook")


class SearchPage(_Record):
    """One page of searchContacts (15 a page). ``count`` counts this page only.

    ``has_more`` is None when the service does not say; then only an empty page ends paging.
    """

    contacts: list[Contact]
    count: int | None = None
    current_page: Annotated[int | None, BeforeValidator(_page_number)] = None
    has_more: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _shapes(cls, data: Any) -> Any:
        if isinstance(data, list):
            return {"contacts": data}
        data = _unwrap(data, "data")
        if not isinstance(data, dict) or "contacts" in data:
            return data
        found = data.get("meta")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        return {**meta, "contacts": data.get("payload")}  # absent: an error, not "no results"


class ConversationPage(_Record):
    """One page of listConversations (25 a page); ``counts`` are the service's meta counts."""

    conversations: list[Conversation]
    counts: dict[str, int | None] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _shapes(cls, data: Any) -> Any:
        if isinstance(data, list):
            return {"conversations": data}
        data = _unwrap(data, "data")
        if not isinstance(data, dict) or "conversations" in data:
            return data
        meta = data.get("meta")
        counts = {k: v for k, v in meta.items() if isinstance(v, int | None)} if isinstance(meta, dict) else {}
        return {"conversations": data.get("payload"), "counts": counts}


class MessagePage(_Record):
    """One page of listMessages (the latest 20, or 20 before/after an id). Its ``meta`` holds
    the contact's details and is dropped."""

    messages: list[Message]

    @model_validator(mode="before")
    @classmethod
    def _shapes(cls, data: Any) -> Any:
        if isinstance(data, list):
            return {"messages": data}
        data = _unwrap(data, "data")
        if isinstance(data, dict) and "messages" not in data:
            return {"messages": data.get("payload")}  # absent: an error, not "no messages"
        return data


@functools.cache
def _list_adapter(model: type[BaseModel]) -> TypeAdapter[list[Any]]:
    return TypeAdapter(list[model])  # type: ignore[valid-type]


def parse_list(model: type[RecordT], body: Any, *keys: str) -> list[RecordT]:
    """A list of records from a body wrapped in ``keys`` (default ``payload``) or a bare list.

    ``parse_list(Webhook, body, "payload", "webhooks")`` reads ``{"payload": {"webhooks": [...]}}``,
    ``{"payload": [...]}``, ``{"webhooks": [...]}`` and ``[...]``. Anything else raises
    pydantic's ``ValidationError``.
    """
    items = _unwrap(body, *(keys or ("payload",)))
    return _list_adapter(model).validate_python(items)
