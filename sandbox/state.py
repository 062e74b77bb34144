"""The in-memory workspace: accounts, inboxes, contacts, bindings, conversations, messages, webhooks.

Concurrency guard: the sandbox runs in one uvicorn process on one asyncio event loop, and no method
here awaits. Each call therefore runs to completion before any other request or timer callback
touches the store, which is the lock. Keep it that way: never add an ``await`` inside a mutation.

Persistence: every change is handed to a :class:`~sandbox.journal.Journal` as a plain record, and
a store that sandbox/persisted.py rebuilds from the file carries on where the last process stopped
(sandbox/journal.py says how). Conversations are written once, at creation: their message list and
last activity are rebuilt from the messages.

Identifiers imitate the real service on purpose: conversations have an account-scoped display id
(1, 2, 3 per account, used in paths) and a different internal id (from 1001, seen only in webhook
payloads), and contact_inbox ids start at 5001, so a client that mixes them up fails here too.
"""

from __future__ import annotations

import base64
import dataclasses
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from sandbox.config import (
    CHANNEL_API,
    CHANNEL_EMAIL,
    CHANNEL_PLATFORM,
    CHANNEL_SMS,
    CHANNEL_WEB_SESSION,
    CHANNEL_WEB_WIDGET,
    Inbox,
    SandboxConfig,
)
from sandbox.journal import Journal
from sandbox.records import (
    ContactInboxRec,
    ContactRec,
    ConversationRec,
    MessageRec,
    NotFound,
    Unprocessable,
    WebhookRec,
)

RANDOM_ID_CHANNELS = frozenset({CHANNEL_API, CHANNEL_WEB_WIDGET})  # source_id is a random UUID
FIRST_IDS = {"contact": 1, "contact_inbox": 5001, "conversation": 1001, "message": 1, "webhook": 1}


class Store:
    """All sandbox data for one seed; :meth:`__init__` is also what ``/_sandbox/reset`` re-runs."""

    def __init__(
        self,
        config: SandboxConfig,
        *,
        rng: random.Random,
        clock: Callable[[], float] = time.time,
        journal: Journal | None = None,
        seed_contacts: bool = True,
    ):
        self.rng = rng
        self.clock = clock
        self.journal = journal or Journal(None)
        self.accounts = {a.id: a for a in config.accounts}
        self.token_accounts = {t.token: frozenset(t.accounts) for t in config.tokens}
        self.inboxes: dict[int, Inbox] = {i.id: i for i in config.inboxes}
        self.contacts: dict[int, ContactRec] = {}
        self.contact_inboxes: dict[int, ContactInboxRec] = {}
        self._binding_by_source: dict[tuple[int, str], ContactInboxRec] = {}
        self._binding_by_pair: dict[tuple[int, int], ContactInboxRec] = {}  # first binding per pair
        self.conversations: dict[int, ConversationRec] = {}
        self._conversation_by_display: dict[tuple[int, int], ConversationRec] = {}
        self._next_display: dict[int, int] = {}
        self.messages: dict[int, MessageRec] = {}
        self.webhooks: dict[int, WebhookRec] = {}
        self.last_incoming_at: dict[tuple[int, int], float] = {}
        self._ids = dict(FIRST_IDS)
        for seeded in config.contacts if seed_contacts else ():
            self.create_contact(
                seeded.account_id,
                name=seeded.name,
                phone_number=seeded.phone_number,
                email=seeded.email,
                identifier=seeded.identifier,
                contact_id=seeded.id,
                sms_opted_out=seeded.sms_opted_out, marketing_opted_out=seeded.marketing_opted_out,
            )

    # -- persistence (sandbox/persisted.py rebuilds a store from the journal) -----------------
    def save_message(self, message: MessageRec) -> None:
        """A message changed (status, provider id, error): write it down."""
        self.journal.write("message", dataclasses.asdict(message))

    def open_window(self, contact_id: int, inbox_id: int, at: float) -> None:
        """An incoming message at ``at`` opens the service window; an older one never moves it back."""
        key = (contact_id, inbox_id)
        self.last_incoming_at[key] = max(self.last_incoming_at.get(key, at), at)
        self.journal.write("window", {"contact_id": contact_id, "inbox_id": inbox_id, "at": self.last_incoming_at[key]})

    # -- ids and randomness ------------------------------------------------------------------
    def restart_ids(self, kind: str, *, after: int) -> None:
        """Ids of ``kind`` go on after ``after`` (a restored store never reuses one)."""
        self._ids[kind] = after + 1

    def _next_id(self, kind: str) -> int:
        value = self._ids[kind]
        self._ids[kind] = value + 1
        return value

    def new_uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def provider_message_id(self, prefix: str) -> str:
        """The rest of a provider's message id: ``wamid.`` + base64, ``SM`` + 32 hex digits."""
        if prefix == "SM":
            return self.rng.randbytes(16).hex()
        return base64.b64encode(self.rng.randbytes(30)).decode("ascii")

    def new_secret(self) -> str:
        return base64.urlsafe_b64encode(self.rng.randbytes(24)).decode("ascii")

    # -- lookups -----------------------------------------------------------------------------
    def inboxes_of(self, account_id: int) -> list[Inbox]:
        return [i for i in self.inboxes.values() if i.account_id == account_id]

    def inbox(self, account_id: int, inbox_id: int) -> Inbox:
        inbox = self.inboxes.get(inbox_id)
        if inbox is None or inbox.account_id != account_id:
            raise NotFound("Inbox not found")
        return inbox

    def contact(self, account_id: int, contact_id: int) -> ContactRec:
        contact = self.contacts.get(contact_id)
        if contact is None or contact.account_id != account_id:
            raise NotFound("Contact not found")
        return contact

    def conversation(self, account_id: int, display_id: int) -> ConversationRec:
        conversation = self._conversation_by_display.get((account_id, display_id))
        if conversation is None:
            raise NotFound("Conversation not found")
        return conversation

    def binding(self, contact_id: int, inbox_id: int) -> ContactInboxRec | None:
        return self._binding_by_pair.get((contact_id, inbox_id))

    # -- contacts ----------------------------------------------------------------------------
    def create_contact(
        self,
        account_id: int,
        *,
        name: str | None,
        phone_number: str | None,
        email: str | None,
        identifier: str | None,
        additional_attributes: dict[str, Any] | None = None,
        contact_id: int | None = None,
        sms_opted_out: bool = False, marketing_opted_out: bool = False,
    ) -> ContactRec:
        """Create a contact; 422 if identifier, phone or e-mail is already taken in the account."""
        taken = []
        for other in self.contacts.values():
            if other.account_id != account_id:
                continue
            if identifier and other.identifier == identifier:
                taken.append("identifier")
            if phone_number and other.phone_number == phone_number:
                taken.append("phone_number")
            if email and other.email and other.email == email.lower():
                taken.append("email")
        if taken:
            label = taken[0].replace("_", " ").capitalize()
            raise Unprocessable(f"{label} has already been taken", attributes=sorted(set(taken)))
        if contact_id is None:
            contact_id = self._next_id("contact")
        else:
            self._ids["contact"] = max(self._ids["contact"], contact_id + 1)
        contact = ContactRec(
            id=contact_id,
            account_id=account_id,
            name=name,
            phone_number=phone_number,
            email=email.lower() if email else email,  # the service stores e-mail addresses lowercased
            identifier=identifier,
            additional_attributes=dict(additional_attributes or {}),
            created_at=self.clock(),
            sms_opted_out=sms_opted_out, marketing_opted_out=marketing_opted_out,
        )
        self.contacts[contact.id] = contact
        self.save_contact(contact)
        return contact

    def save_contact(self, contact: ContactRec) -> None:
        self.journal.write("contact", dataclasses.asdict(contact))

    def search_contacts(self, account_id: int, query: str) -> list[ContactRec]:
        """Case-insensitive substring match over name, email, phone and identifier, by id."""
        needle = query.lower()
        found = []
        for contact in self.contacts.values():
            if contact.account_id != account_id:
                continue
            fields = (contact.name, contact.email, contact.phone_number, contact.identifier)
            if any(value and needle in value.lower() for value in fields):
                found.append(contact)
        return sorted(found, key=lambda c: c.id)

    def derived_source_id(self, contact: ContactRec, inbox: Inbox) -> str | None:
        """The channel's own address for a contact, or None where the channel cannot reach it.

        API inboxes have none: their source_id is invented (see :meth:`contactable_source_id`).
        """
        kind = inbox.channel_type
        if kind in (CHANNEL_PLATFORM, CHANNEL_WEB_SESSION):
            return contact.phone_number.lstrip("+") if contact.phone_number else None
        if kind == CHANNEL_SMS:
            return contact.phone_number or None
        if kind == CHANNEL_EMAIL:
            return contact.email or None
        return None

    def contactable_source_id(self, contact: ContactRec, inbox: Inbox) -> str | None:
        """What listContactableInboxes shows: an existing binding, the derived address, or for an
        API inbox a FRESH random id on every call (the real service does not store it)."""
        existing = self.binding(contact.id, inbox.id)
        if existing is not None:
            return existing.source_id
        if inbox.channel_type in RANDOM_ID_CHANNELS:
            return self.new_uuid()
        return self.derived_source_id(contact, inbox)

    def bind(self, contact: ContactRec, inbox: Inbox, source_id: str) -> ContactInboxRec:
        existing = self._binding_by_source.get((inbox.id, source_id))
        if existing is not None:
            return existing
        rec = ContactInboxRec(
            id=self._next_id("contact_inbox"),
            contact_id=contact.id,
            inbox_id=inbox.id,
            source_id=source_id,
            created_at=self.clock(),
        )
        self.index_binding(rec)
        self.journal.write("binding", dataclasses.asdict(rec))
        return rec

    def index_binding(self, rec: ContactInboxRec) -> None:
        self.contact_inboxes[rec.id] = rec
        self._binding_by_source[(rec.inbox_id, rec.source_id)] = rec
        self._binding_by_pair.setdefault((rec.contact_id, rec.inbox_id), rec)

    def bind_for_creation(self, contact: ContactRec, inbox: Inbox) -> ContactInboxRec:
        """createContact's binding to its inbox; 422 when the channel needs an address it lacks."""
        if inbox.channel_type in RANDOM_ID_CHANNELS:
            return self.bind(contact, inbox, self.new_uuid())
        source_id = self.derived_source_id(contact, inbox)
        if source_id is None:
            needed = "email" if inbox.channel_type == CHANNEL_EMAIL else "phone_number"
            raise Unprocessable(f"{needed} is required for this inbox", attributes=[needed])
        return self.bind(contact, inbox, source_id)

    def find_binding(self, account_id: int, source_id: str, inbox_id: int | None) -> ContactInboxRec | None:
        for inbox in self.inboxes_of(account_id):
            if inbox_id is not None and inbox.id != inbox_id:
                continue
            rec = self._binding_by_source.get((inbox.id, source_id))
            if rec is not None:
                return rec
        return None

    # -- conversations -----------------------------------------------------------------------
    def create_conversation(
        self,
        account_id: int,
        binding: ContactInboxRec,
        *,
        status: str,
        custom_attributes: dict[str, Any],
        additional_attributes: dict[str, Any],
    ) -> tuple[ConversationRec, bool]:
        """A new thread, or with lock_to_single_conversation the pair's latest unresolved one.

        Returns (conversation, created).
        """
        inbox = self.inboxes[binding.inbox_id]
        if inbox.lock_to_single_conversation:
            for existing in reversed(list(self.conversations.values())):
                if existing.contact_inbox_id == binding.id and existing.status != "resolved":
                    return existing, False
        display_id = self._next_display.get(account_id, 1)
        now = self.clock()
        conversation = ConversationRec(
            id=self._next_id("conversation"),
            display_id=display_id,
            uuid=self.new_uuid(),
            account_id=account_id,
            inbox_id=binding.inbox_id,
            contact_id=binding.contact_id,
            contact_inbox_id=binding.id,
            status=status,
            custom_attributes=dict(custom_attributes),
            additional_attributes=dict(additional_attributes),
            created_at=now,
            last_activity_at=now,
        )
        self.index_conversation(conversation)
        self.journal.write("conversation", conversation_record(conversation))
        return conversation, True

    def index_conversation(self, conversation: ConversationRec) -> None:
        self.conversations[conversation.id] = conversation
        self._conversation_by_display[(conversation.account_id, conversation.display_id)] = conversation
        account_id = conversation.account_id
        self._next_display[account_id] = max(self._next_display.get(account_id, 1), conversation.display_id + 1)

    def list_conversations(self, account_id: int, *, inbox_id: int | None, status: str) -> list[ConversationRec]:
        """Filtered, most recent activity first (as the real list is ordered)."""
        rows = [
            c
            for c in self.conversations.values()
            if c.account_id == account_id
            and (inbox_id is None or c.inbox_id == inbox_id)
            and (status == "all" or c.status == status)
        ]
        return sorted(rows, key=lambda c: (c.last_activity_at, c.id), reverse=True)

    # -- messages ----------------------------------------------------------------------------
    def add_message(self, conversation: ConversationRec, **fields: Any) -> MessageRec:
        now = self.clock()
        fields.setdefault("created_at", now)
        message = MessageRec(
            id=self._next_id("message"),
            account_id=conversation.account_id,
            inbox_id=conversation.inbox_id,
            conversation_id=conversation.id,
            contact_id=conversation.contact_id,
            updated_at=now,
            **fields,
        )
        self.messages[message.id] = message
        conversation.message_ids.append(message.id)
        conversation.last_activity_at = max(conversation.last_activity_at, message.created_at)
        self.save_message(message)
        return message

    def page_messages(self, conversation: ConversationRec, *, before: int | None, after: int | None) -> list[MessageRec]:
        """Oldest first, as the service's message finder pages them: the latest 20 by default;
        ``before``: the 20 before that id; ``after``: up to 100 after it; both: ``[after, before)``,
        up to 1,000."""
        ids = conversation.message_ids
        if after is not None and before is not None:
            chosen = [i for i in ids if after <= i < before][:1000]
        elif before is not None:
            chosen = [i for i in ids if i < before][-20:]
        elif after is not None:
            chosen = [i for i in ids if i > after][:100]
        else:
            chosen = ids[-20:]
        return [self.messages[i] for i in chosen]

    def latest_message(self, conversation: ConversationRec) -> MessageRec | None:
        return self.messages[conversation.message_ids[-1]] if conversation.message_ids else None

    # -- webhooks ----------------------------------------------------------------------------
    def create_webhook(
        self, account_id: int, *, url: str, name: str | None, inbox_id: int | None, subscriptions: list[str]
    ) -> WebhookRec:
        hook = WebhookRec(
            id=self._next_id("webhook"),
            account_id=account_id,
            name=name,
            url=url,
            inbox_id=inbox_id,
            subscriptions=list(dict.fromkeys(subscriptions)),
            secret=self.new_secret(),
        )
        self.webhooks[hook.id] = hook
        self.journal.write("webhook", dataclasses.asdict(hook))
        return hook

    def subscribers(self, account_id: int, event: str, inbox_id: int | None) -> list[WebhookRec]:
        """Webhooks of the account subscribed to ``event``; inbox-bound ones only for their inbox."""
        return [
            hook
            for hook in self.webhooks.values()
            if hook.account_id == account_id
            and event in hook.subscriptions
            and (hook.inbox_id is None or hook.inbox_id == inbox_id)
        ]


def conversation_record(conversation: ConversationRec) -> dict[str, Any]:
    """A conversation as stored: without its message list, which the messages rebuild."""
    record = dataclasses.asdict(conversation)
    record.pop("message_ids")
    return record
