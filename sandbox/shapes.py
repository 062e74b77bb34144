"""JSON shapes of records, as the real service serialises them (field notes, "Response shapes").

Two families on purpose, because the real service has two and clients trip over the difference:

* API responses: ``message_type`` an integer, ``created_at`` unix seconds, conversation ``id`` the
  display id, failure text in ``content_attributes.external_error`` and top-level ``external_error``;
* webhook payloads: ``conversation.contact_inbox.id`` an internal id, and ``conversation.messages[0]``
  the conversation's latest message in the push-event form (integer ``message_type`` again). The
  message fields themselves follow the profile (sandbox/profiles.py): stock writes ``message_type``
  as a name, ``created_at`` as ISO-8601 with milliseconds, no top-level ``status`` and a stock
  contact as the sender of an incoming message; contract writes the Message resource's numbers and
  a top-level ``status``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sandbox.config import Inbox
from sandbox.profiles import Profile
from sandbox.records import MESSAGE_INCOMING, MESSAGE_TYPE_NAMES, ContactRec, ConversationRec, MessageRec, WebhookRec
from sandbox.state import Store

INTEGRATION_SENDER = {"id": 1, "name": "Sandbox Integration", "type": "user"}
# The stock service's user (agent or integration token owner) as a webhook sender.
STOCK_USER_SENDER = {
    "id": 1,
    "name": "Sandbox Integration",
    "available_name": "Sandbox Integration",
    "avatar_url": "",
    "type": "user",
    "availability_status": "offline",
    "thumbnail": "",
}


def iso(ts: float) -> str:
    """ISO-8601 in UTC with milliseconds and a Z, as Rails writes timestamps."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def inbox_json(inbox: Inbox) -> dict[str, Any]:
    return {
        "id": inbox.id,
        "account_id": inbox.account_id,
        "name": inbox.name,
        "channel_type": inbox.channel_type,
        "lock_to_single_conversation": inbox.lock_to_single_conversation,
    }


def contact_json(contact: ContactRec) -> dict[str, Any]:
    return {
        "id": contact.id,
        "name": contact.name,
        "email": contact.email,
        "phone_number": contact.phone_number,
        "identifier": contact.identifier,
        "additional_attributes": dict(contact.additional_attributes),
        "custom_attributes": {},
        "thumbnail": "",
        "availability_status": "offline",
        "blocked": False,
        "created_at": int(contact.created_at),
    }


def _sender(store: Store, message: MessageRec) -> dict[str, Any] | None:
    if message.message_type == MESSAGE_INCOMING:
        contact = store.contacts.get(message.contact_id)
        return {"id": message.contact_id, "name": contact.name if contact else None, "type": "contact"}
    return dict(INTEGRATION_SENDER)


def message_json(store: Store, message: MessageRec) -> dict[str, Any]:
    """A message in API responses (createMessage, listMessages)."""
    conversation = store.conversations[message.conversation_id]
    return {
        "id": message.id,
        "content": message.content,
        "account_id": message.account_id,
        "inbox_id": message.inbox_id,
        "conversation_id": conversation.display_id,
        "message_type": message.message_type,
        "content_type": "text",
        "status": message.status,
        "content_attributes": dict(message.content_attributes),
        "additional_attributes": dict(message.additional_attributes),
        "external_error": message.external_error,
        "created_at": int(message.created_at),
        "private": message.private,
        "source_id": message.source_id,
        "sender": _sender(store, message),
    }


def conversation_json(store: Store, conversation: ConversationRec) -> dict[str, Any]:
    """A conversation in API responses; ``id`` is the display id used in paths."""
    latest = store.latest_message(conversation)
    contact = store.contacts[conversation.contact_id]
    return {
        "id": conversation.display_id,
        "uuid": conversation.uuid,
        "account_id": conversation.account_id,
        "inbox_id": conversation.inbox_id,
        "status": conversation.status,
        "contact_inbox": {"source_id": store.contact_inboxes[conversation.contact_inbox_id].source_id},
        "meta": {
            "sender": contact_json(contact),
            "channel": store.inboxes[conversation.inbox_id].channel_type,
            "assignee": None,
        },
        "messages": [message_json(store, latest)] if latest else [],
        "custom_attributes": dict(conversation.custom_attributes),
        "additional_attributes": dict(conversation.additional_attributes),
        "unread_count": 0,
        "created_at": int(conversation.created_at),
        "timestamp": int(conversation.last_activity_at),
    }


def webhook_json(hook: WebhookRec) -> dict[str, Any]:
    return {
        "id": hook.id,
        "name": hook.name,
        "url": hook.url,
        "account_id": hook.account_id,
        "inbox_id": hook.inbox_id,
        "subscriptions": list(hook.subscriptions),
        "secret": hook.secret,
    }


# -- webhook payloads ---------------------------------------------------------------------------
def _push_event_message(store: Store, message: MessageRec) -> dict[str, Any]:
    """The compact form inside ``conversation.messages``: integer type, unix seconds."""
    conversation = store.conversations[message.conversation_id]
    return {
        "id": message.id,
        "content": message.content,
        "account_id": message.account_id,
        "inbox_id": message.inbox_id,
        "conversation_id": conversation.display_id,
        "message_type": message.message_type,
        "created_at": int(message.created_at),
        "private": message.private,
        "status": message.status,
        "source_id": message.source_id,
        "content_type": "text",
        "content_attributes": dict(message.content_attributes),
        "additional_attributes": dict(message.additional_attributes),
    }


def _contact_push(contact: ContactRec) -> dict[str, Any]:
    return {
        "id": contact.id,
        "name": contact.name,
        "email": contact.email,
        "phone_number": contact.phone_number,
        "identifier": contact.identifier,
        "additional_attributes": dict(contact.additional_attributes),
        "custom_attributes": {},
        "thumbnail": "",
        "type": "contact",
    }


def conversation_event(store: Store, conversation: ConversationRec) -> dict[str, Any]:
    """``conversation`` as webhooks carry it; ``contact_inbox.id`` is internal, never a path id."""
    binding = store.contact_inboxes[conversation.contact_inbox_id]
    latest = store.latest_message(conversation)
    inbox = store.inboxes[conversation.inbox_id]
    return {
        "id": conversation.display_id,
        "inbox_id": conversation.inbox_id,
        "status": conversation.status,
        "channel": inbox.channel_type,
        "can_reply": True,
        "contact_inbox": {
            "id": binding.id,
            "contact_id": binding.contact_id,
            "inbox_id": binding.inbox_id,
            "source_id": binding.source_id,
            "created_at": iso(binding.created_at),
            "hmac_verified": False,
        },
        "messages": [_push_event_message(store, latest)] if latest else [],
        "labels": [],
        "meta": {
            "sender": _contact_push(store.contacts[conversation.contact_id]),
            "assignee": None,
            "team": None,
            "hmac_verified": False,
        },
        "custom_attributes": dict(conversation.custom_attributes),
        "additional_attributes": dict(conversation.additional_attributes),
        "unread_count": 0,
        "created_at": int(conversation.created_at),
        "timestamp": int(conversation.last_activity_at),
        "last_activity_at": int(conversation.last_activity_at),
        # A message's change touches its conversation (the service's messages belong to it with
        # ``touch: true``), so two updates of one message never carry the same conversation.
        "updated_at": conversation_updated_at(store, conversation),
    }


def conversation_updated_at(store: Store, conversation: ConversationRec) -> float:
    """When the conversation or one of its messages last changed (unix seconds, as a float)."""
    return max([conversation.created_at, *(store.messages[i].updated_at for i in conversation.message_ids)])


def event_sender(store: Store, message: MessageRec, dialect: Profile) -> dict[str, Any] | None:
    """``sender`` of a message event. Stock: an incoming message's sender is the contact in the
    stock webhook shape (no ``type`` key), an outgoing one's the user; contract: ``{id, name, type}``."""
    if dialect.event_sender == "contract":
        return _sender(store, message)
    if message.message_type != MESSAGE_INCOMING:
        return dict(STOCK_USER_SENDER)
    contact = store.contacts.get(message.contact_id)
    if contact is None:
        return None
    account = store.accounts[contact.account_id]
    return {
        "account": {"id": account.id, "name": account.name},
        "additional_attributes": dict(contact.additional_attributes),
        "avatar": "",
        "custom_attributes": {},
        "email": contact.email,
        "id": contact.id,
        "identifier": contact.identifier,
        "name": contact.name,
        "phone_number": contact.phone_number,
        "thumbnail": "",
        "blocked": False,
    }


def message_event(
    store: Store, message: MessageRec, event: str, *, dialect: Profile, include_status: bool
) -> dict[str, Any]:
    """The field notes' "Message event payload" in the profile's shape; ``status`` only if
    ``include_status`` (the profile's default, unless the configuration says otherwise)."""
    inbox = store.inboxes[message.inbox_id]
    account = store.accounts[message.account_id]
    by_name = dialect.event_message_type == "name"
    payload: dict[str, Any] = {
        "event": event,
        "id": message.id,
        "content": message.content,
        "content_type": "text",
        "content_attributes": dict(message.content_attributes),
        "additional_attributes": dict(message.additional_attributes),
        "message_type": MESSAGE_TYPE_NAMES[message.message_type] if by_name else message.message_type,
        "private": message.private,
        "source_id": message.source_id,
        "created_at": iso(message.created_at) if dialect.event_created_at == "iso" else int(message.created_at),
        "sender": event_sender(store, message, dialect),
        "inbox": {"id": inbox.id, "name": inbox.name},
        "account": {"id": account.id, "name": account.name},
        "conversation": conversation_event(store, store.conversations[message.conversation_id]),
    }
    if include_status:
        payload["status"] = message.status
    return payload


def conversation_created_event(store: Store, conversation: ConversationRec) -> dict[str, Any]:
    account = store.accounts[conversation.account_id]
    return {
        "event": "conversation_created",
        **conversation_event(store, conversation),
        "account": {"id": account.id, "name": account.name},
    }


def contact_created_event(store: Store, contact: ContactRec) -> dict[str, Any]:
    account = store.accounts[contact.account_id]
    return {"event": "contact_created", **_contact_push(contact), "account": {"id": account.id, "name": account.name}}
