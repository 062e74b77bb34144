"""Read a verified webhook payload down to the few values the outcome consumer needs.

The payload carries message content, the contact's name, phone number and e-mail, and source
IDs (phone numbers on the business-messaging platform). None of that is kept: an
:class:`EventSummary` holds IDs, the status, the message type, the error text (at most 200
characters), the private flag and a time. It is what ``webhook_deliveries.summary`` stores.

Tolerant reading (field notes, "Webhook deliveries in the field"):

* ``status`` is absent at the top level in stock releases; but a stock event's
  ``conversation.messages[0]`` is the conversation's latest message with its ``status`` (the
  field notes: "not necessarily this one"): when its ID is the event's, that status is the
  message's own at the moment the event was made, and it is read. None means "not reported, read
  the message list"; an unknown value reads as None too.
* ``message_type`` is a string in payloads (``incoming``, ``outgoing``, ``template``) and an
  integer (0..3) in API shapes: both become the name.
* ``external_error`` is read from the top level, else from ``content_attributes``.
* ``conversation.id`` is the display ID; ``conversation.contact_inbox.id`` is internal and is
  never read.
* ``created_at`` is ISO-8601 or unix seconds; both become an aware UTC datetime.
* An ID is a positive integer below 2**63 (a digit string is accepted); anything else is None.
* An incoming message's text is read only to see whether it is, whole, one of the routes' opt-out
  or opt-in keywords (``reply_words``): then the keyword is kept, with keyed hashes of the sender's
  phone number, e-mail and identifier (``sender_keys``); any other text is forgotten.

Only ``message_created`` and ``message_updated`` are read for message fields; other events are
kept as ``event="other"`` with every field None, so the consumer can mark them ignored.

``body_digest`` is a keyed hash of the exact body (the deployment's hashing key: nothing of the
content can be learnt from it). Two updates of one message differ in their body (each change of a
message touches its conversation's ``updated_at``), a copy of one delivered twice does not: the
consumer counts an outgoing message's distinct updates by it (docs/tracking.md, "A status the
workspace overwrote").
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from dispatcher.policy.fallback import code_prefix
from dispatcher.recipients.contact import E164
from dispatcher.recipients.keys import recipient_keys
from dispatcher.recipients.keywords import keyword_of

MESSAGE_EVENTS = ("message_created", "message_updated")
_STATUSES = ("sent", "delivered", "read", "failed")  # the service's enum order
_TYPES = ("incoming", "outgoing", "activity", "template")  # 0..3
_MAX_ID = 2**63 - 1
ERROR_MAX_CHARS = 200


class EventSummary(BaseModel):
    """What one delivery says about one message; JSON-safe with ``model_dump(mode="json")``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: Literal["message_created", "message_updated", "other"]
    message_id: int | None = None
    status: str | None = None
    message_type: str | None = None
    private: bool | None = None
    external_error: str | None = None
    conversation_display_id: int | None = None
    inbox_id: int | None = None
    account_id: int | None = None
    contact_id: int | None = None
    created_at: datetime | None = None
    reply_keyword: str | None = None  # an incoming message that is, whole, an opt-out or opt-in keyword
    sender_keys: tuple[str, ...] = ()  # that reply's sender, as keyed hashes (docs/opt-outs.md)
    body_digest: str | None = None  # a keyed hash of the delivered body: tells a copy from another update

    @property
    def clean_update(self) -> str | None:
        """The digest of an update of one of our outgoing messages that reports no failure (no
        error, no ``failed`` status): the message changed in a way that is not a failure. None for
        anything else. Two distinct ones mean the message moved past ``sent``."""
        if (self.event != "message_updated" or self.message_id is None or self.external_error is not None
                or self.status == "failed" or self.private is True or self.message_type == "incoming"):
            return None
        return self.body_digest


def body_digest(body: bytes, *, key: bytes) -> str:
    """A keyed hash of a delivered body (32 hex characters): equal for a copy, unequal for another update."""
    return hmac.new(key, body, hashlib.sha256).hexdigest()[:32]


def summarize(payload: Mapping[str, Any], *, reply_words: frozenset[str] = frozenset(),
              hashing_key: bytes | None = None, digest: str | None = None) -> EventSummary | None:
    """The summary of a webhook payload, or None when it is not an event (no string ``event``).
    ``digest``: the delivered body's :func:`body_digest`, kept as ``body_digest``."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("event"), str):
        return None
    if payload["event"] not in MESSAGE_EVENTS:
        return EventSummary(event="other")
    conversation = _mapping(payload.get("conversation"))
    message_type = _choice(payload.get("message_type"), _TYPES)
    message_id = _id(payload.get("id"))
    keyword = keyword_of(payload.get("content"), reply_words) if message_type == "incoming" else None
    return EventSummary(
        reply_keyword=keyword,
        sender_keys=_sender_keys(payload, hashing_key) if keyword is not None and hashing_key else (),
        event=payload["event"],
        message_id=message_id,
        status=_choice(payload.get("status"), _STATUSES) or _own_latest_status(conversation, message_id),
        message_type=message_type,
        private=payload.get("private") if isinstance(payload.get("private"), bool) else None,
        external_error=_external_error(payload),
        conversation_display_id=_id(conversation.get("id")),
        inbox_id=_id(_mapping(payload.get("inbox")).get("id")),
        account_id=_id(_mapping(payload.get("account")).get("id")),
        contact_id=_contact_id(payload, conversation, incoming=message_type == "incoming"),
        created_at=_time(payload.get("created_at")),
        body_digest=digest,
    )


def _own_latest_status(conversation: Mapping[str, Any], message_id: int | None) -> str | None:
    """The status a stock event carries for its message when that message is its conversation's
    latest (``conversation.messages[0]``); None when the latest is another message, or says none."""
    latest = conversation.get("messages")
    if message_id is None or not isinstance(latest, list) or not latest:
        return None
    first = _mapping(latest[0])
    return _choice(first.get("status"), _STATUSES) if _id(first.get("id")) == message_id else None


def _sender_keys(payload: Mapping[str, Any], hashing_key: bytes) -> tuple[str, ...]:
    """Keyed hashes of the sender's phone number, e-mail and identifier, where the payload has them
    (a stock sender does; the contract's ``{id, name, type}`` does not: then the consumer asks the
    contact cache by the contact's ID)."""
    sender = _mapping(payload.get("sender"))
    fields = {name: value.strip() if isinstance(value, str) and value.strip() else None
              for name, value in ((name, sender.get(name)) for name in ("identifier", "phone_number", "email"))}
    phone = fields["phone_number"]
    if phone is not None and not E164.match(phone):
        phone = None
    return tuple(recipient_keys(key=hashing_key, identifier=fields["identifier"], phone_number=phone,
                                email=fields["email"]))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _id(value: Any) -> int | None:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_ID:
        return value
    return None


def _choice(value: Any, names: tuple[str, ...]) -> str | None:
    """A name from ``names``, given as the name (any case) or its index (int or digit string)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in names:
            return text
        value = int(text) if text.isascii() and text.isdigit() and len(text) <= 2 else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    return None


def _external_error(payload: Mapping[str, Any]) -> str | None:
    error = payload.get("external_error")
    if not isinstance(error, str) or not error:
        error = _mapping(payload.get("content_attributes")).get("external_error")
    return redacted_error(error)[:ERROR_MAX_CHARS] if isinstance(error, str) and error else None


# A provider's error text may quote the recipient ("The 'To' number +1 555 010 9999 is not valid", a
# bounce naming the address): kept from here on (summaries, error_detail, callbacks, the dashboard),
# so what looks like a number or an address is replaced; the leading error code is kept.
_NUMBER_LIKE = re.compile(r"\+?\d(?:[\s().-]{0,3}\d){4,}")
_ADDRESS_LIKE = re.compile(r"[^\s@'\"<>(),;:]+@[^\s@'\"<>(),;:]+")


def redacted_error(text: str) -> str:
    """``text`` with its error code kept and every number of five digits or more, or address, replaced."""
    head = code_prefix(text)  # what the fallback rules read (dispatcher.policy.fallback)
    rest = text[len(head):]
    return head + _NUMBER_LIKE.sub("[number]", _ADDRESS_LIKE.sub("[address]", rest))


def _contact_id(payload: Mapping[str, Any], conversation: Mapping[str, Any], *, incoming: bool) -> int | None:
    """The conversation's contact: the sender of an incoming message, else the conversation's.

    A stock sender has no ``type`` key (the contact's webhook shape); the contract's says "contact".
    An incoming message's sender is the contact either way, unless it says it is something else.
    """
    sender = _mapping(payload.get("sender"))
    sender_type = str(sender.get("type", "contact" if incoming else "")).lower()
    if sender_type == "contact" and _id(sender.get("id")):
        return _id(sender.get("id"))
    meta_sender = _mapping(_mapping(conversation.get("meta")).get("sender"))
    if str(meta_sender.get("type", "contact")).lower() == "contact" and _id(meta_sender.get("id")):
        return _id(meta_sender.get("id"))
    return _id(_mapping(conversation.get("contact_inbox")).get("contact_id"))


def _time(value: Any) -> datetime | None:
    try:
        if isinstance(value, str):
            text = value.strip()
            if text.isascii() and text.isdigit():
                return datetime.fromtimestamp(int(text), UTC)
            parsed = datetime.fromisoformat(text)
            return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None
