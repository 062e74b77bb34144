"""Between the store and its state file: every record as the journal writes it, and back.

The journal (sandbox/journal.py) knows lines and files, the store (sandbox/state.py) knows records
and indexes; this module is the only one that knows both, so each stays small.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from sandbox.journal import Restored, StateFileError
from sandbox.records import ContactInboxRec, ContactRec, ConversationRec, MessageRec, WebhookRec
from sandbox.state import FIRST_IDS, Store, conversation_record


def restore(store: Store, restored: Restored) -> None:
    """Rebuild every record and index of an empty store; counters restart past the largest ids.

    Raises StateFileError when the file holds data for an account or inbox the seed lacks (a file
    kept from another seed): carrying on would fail later, on some request, with less to go on.
    """
    records = restored.records
    for kind in ("contact", "conversation", "message", "webhook"):
        for raw in records[kind].values():
            if raw.get("account_id") not in store.accounts:
                raise StateFileError(f"it holds a {kind} of account {raw.get('account_id')}, which the seed lacks;"
                                     " start with --fresh or another --state")
    for kind in ("binding", "conversation", "message"):
        for raw in records[kind].values():
            if raw.get("inbox_id") not in store.inboxes:
                raise StateFileError(f"it holds a {kind} of inbox {raw.get('inbox_id')}, which the seed lacks;"
                                     " start with --fresh or another --state")
    for raw in records["contact"].values():
        contact = ContactRec(**raw)
        store.contacts[contact.id] = contact
    for raw in sorted(records["binding"].values(), key=lambda r: r["id"]):
        store.index_binding(ContactInboxRec(**raw))
    for raw in sorted(records["conversation"].values(), key=lambda r: r["id"]):
        store.index_conversation(ConversationRec(**raw))
    for raw in sorted(records["message"].values(), key=lambda r: r["id"]):
        message = MessageRec(**raw)
        store.messages[message.id] = message
        conversation = store.conversations[message.conversation_id]
        conversation.message_ids.append(message.id)
        conversation.last_activity_at = max(conversation.last_activity_at, message.created_at)
    for raw in records["webhook"].values():
        hook = WebhookRec(**raw)
        store.webhooks[hook.id] = hook
    for raw in records["window"].values():
        store.last_incoming_at[(raw["contact_id"], raw["inbox_id"])] = raw["at"]
    tables: dict[str, dict[int, Any]] = {
        "contact": store.contacts,
        "contact_inbox": store.contact_inboxes,
        "conversation": store.conversations,
        "message": store.messages,
        "webhook": store.webhooks,
    }
    for kind, table in tables.items():
        store.restart_ids(kind, after=max([FIRST_IDS[kind] - 1, *table]))


def records(store: Store) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every record of the store as the journal writes it (for compaction)."""
    for contact in store.contacts.values():
        yield "contact", dataclasses.asdict(contact)
    for binding in store.contact_inboxes.values():
        yield "binding", dataclasses.asdict(binding)
    for conversation in store.conversations.values():
        yield "conversation", conversation_record(conversation)
    for message in store.messages.values():
        yield "message", dataclasses.asdict(message)
    for hook in store.webhooks.values():
        yield "webhook", dataclasses.asdict(hook)
    for (contact_id, inbox_id), at in store.last_incoming_at.items():
        yield "window", {"contact_id": contact_id, "inbox_id": inbox_id, "at": at}
