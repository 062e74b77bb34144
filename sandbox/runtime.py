"""The running sandbox: store, channels, webhooks, faults and stats, and the flows that span them.

One :class:`Sandbox` lives on ``app.state.sandbox``. Flows that touch several parts (store a message,
start its channel fate, announce it by webhook) live here so route modules stay thin.
:meth:`Sandbox.reset` rebuilds everything from the configuration, with the same random seed, so a
test that resets gets the same ids, source_ids and secrets as a fresh process (and empties the state
file). A sandbox started on a state file carries on from it: see sandbox/journal.py.
"""

from __future__ import annotations

import random
from typing import Any

from sandbox import persisted, shapes
from sandbox.channels import ERROR_THROUGHPUT, Channels, Plan, SlidingWindow, sms_keyword
from sandbox.config import CHANNEL_SMS, SandboxConfig
from sandbox.faults import FaultTable
from sandbox.journal import Journal, Restored
from sandbox.records import MESSAGE_INCOMING, MESSAGE_OUTGOING, ContactRec, ConversationRec, MessageRec, Unprocessable
from sandbox.state import Store
from sandbox.stats import Stats
from sandbox.webhooks import WebhookDispatcher


class OverSendCap(Exception):
    """The inbox reached its sends_per_minute and over_send_cap is "reject" (answered 429)."""


def stream_seed(random_seed: int, boots: int) -> int:
    """The first start of a state uses the configured seed; each restart a stream of its own, so a
    restarted sandbox never repeats the source_ids, secrets and delivery ids it gave out before."""
    return random_seed if boots == 0 else random_seed + 1_000_003 * boots


class Sandbox:
    def __init__(self, config: SandboxConfig, *, journal: Journal | None = None, fresh: bool = False) -> None:
        """``journal``: the state file to carry on from and write to (None: memory only).
        Raises journal.StateFileError when the file cannot be used."""
        self.config = config
        self.journal = journal or Journal(None)
        restored = self.journal.open(fresh=fresh)
        self.stats = Stats()
        self.faults = FaultTable(config.faults, seed=config.behaviour.random_seed)
        self.rng = random.Random(stream_seed(config.behaviour.random_seed, self.journal.boots))
        self.webhooks = WebhookDispatcher(
            config.webhooks, escape_html=config.dialect.escape_html_in_json, rng=self.rng, stats=self.stats
        )
        self._load(restored)
        self.restored_records = sum(len(table) for table in restored.records.values())
        self.journal.start_counted(persisted.records(self.store))

    def _load(self, restored: Restored | None = None) -> None:
        carry_on = restored is not None and not restored.empty
        self.store = Store(self.config, rng=self.rng, journal=self.journal, seed_contacts=not carry_on)
        if restored is not None and carry_on:
            persisted.restore(self.store, restored)
        self.channels = Channels(
            self.config.behaviour, self.config.recipient_rules, self.store, on_status=self._status_changed
        )
        self.searches = SlidingWindow(60.0)

    def resume(self) -> None:
        """Carry on with the restored messages' channel fates (needs the running event loop)."""
        for message in self.store.messages.values():
            if message.dispatched and message.message_type == MESSAGE_OUTGOING:
                self.channels.resume(message)

    def close(self) -> None:
        """At a clean stop: compact the state file and release it."""
        self.channels.cancel()
        self.journal.close(persisted.records(self.store))

    def reset(self) -> None:
        self.channels.cancel()
        self.rng = random.Random(self.config.behaviour.random_seed)
        self.journal.rewrite(())
        self._load()
        self.stats.reset()
        self.faults.reset()
        self.webhooks.reset(self.rng)

    # -- webhook announcements ---------------------------------------------------------------
    def announce_message(self, message: MessageRec, event: str) -> None:
        hooks = self.store.subscribers(message.account_id, event, message.inbox_id)
        if hooks:
            payload = shapes.message_event(
                self.store,
                message,
                event,
                dialect=self.config.dialect,
                include_status=self.config.webhooks.include_status,
            )
            self.webhooks.publish(hooks, event, payload)

    def announce_conversation(self, conversation: ConversationRec) -> None:
        hooks = self.store.subscribers(conversation.account_id, "conversation_created", conversation.inbox_id)
        if hooks:
            self.webhooks.publish(
                hooks, "conversation_created", shapes.conversation_created_event(self.store, conversation)
            )

    def announce_contact(self, contact: ContactRec) -> None:
        hooks = self.store.subscribers(contact.account_id, "contact_created", None)
        if hooks:
            self.webhooks.publish(hooks, "contact_created", shapes.contact_created_event(self.store, contact))

    def _status_changed(self, message: MessageRec) -> None:
        self.announce_message(message, "message_updated")

    # -- flows ---------------------------------------------------------------------------------
    def searches_exhausted(self, account_id: int) -> bool:
        """Contact search limit per account a minute (0 = unlimited); counts this call if allowed."""
        limit = self.config.behaviour.contact_search_per_minute
        if limit and self.searches.count(account_id) >= limit:
            return True
        self.searches.add(account_id)
        return False

    def send_message(
        self,
        conversation: ConversationRec,
        *,
        content: str,
        message_type: str,
        private: bool,
        template_params: dict[str, Any] | None,
        source_id: str | None,
    ) -> MessageRec:
        """createMessage after validation: limits, store, channel fate, message_created.

        Raises Unprocessable for "Too many messages" and OverSendCap for a capped inbox.
        """
        channels = self.channels
        if channels.conversation_messages.count(conversation.id) >= self.config.behaviour.conversation_messages_per_minute:
            raise Unprocessable("Too many messages")
        if message_type == "incoming":
            return self.receive_message(conversation, content=content, age_s=0.0, source_id=source_id)
        inbox = self.store.inboxes[conversation.inbox_id]
        contact = self.store.contacts[conversation.contact_id]
        dispatched = not private and source_id is None
        plan = Plan("hold")
        if dispatched:
            if channels.over_send_cap(inbox):
                if self.config.behaviour.over_send_cap == "reject":
                    raise OverSendCap()
                plan = Plan("fail", ERROR_THROUGHPUT)
            else:
                plan = channels.plan(inbox, contact, template_params)
            channels.sends.add(inbox.id)
        channels.conversation_messages.add(conversation.id)
        initial = None if self.config.behaviour.initial_status == "null" else "sent"
        additional = {"template_params": template_params} if template_params is not None else {}
        message = self.store.add_message(
            conversation,
            content=content,
            message_type=MESSAGE_OUTGOING,
            private=private,
            source_id=source_id,
            status=initial,
            template_params=template_params,
            additional_attributes=additional,
            dispatched=dispatched,
            plan_effect=plan.effect,  # written with the message: a sandbox killed now resumes it
            plan_error=plan.external_error,
        )
        self.announce_message(message, "message_created")
        channels.start(message)
        return message

    def receive_message(
        self, conversation: ConversationRec, *, content: str, age_s: float, source_id: str | None = None
    ) -> MessageRec:
        """A customer's message: stored as incoming, opens the service window, message_created."""
        created_at = self.store.clock() - age_s
        message = self.store.add_message(
            conversation,
            content=content,
            message_type=MESSAGE_INCOMING,
            private=False,
            source_id=source_id,
            status="sent",
            created_at=created_at,
        )
        self.store.open_window(conversation.contact_id, conversation.inbox_id, created_at)
        contact = self.store.contacts.get(conversation.contact_id)
        opted_out = sms_keyword(content)
        if (opted_out is not None and contact is not None
                and self.store.inboxes[conversation.inbox_id].channel_type == CHANNEL_SMS):
            contact.sms_opted_out = opted_out  # the provider honours STOP/START itself, as Twilio does
            self.store.save_contact(contact)
        self.announce_message(message, "message_created")
        return message

    def inspect_message(self, message: MessageRec) -> dict[str, Any]:
        """One row of ``GET /_sandbox/messages``."""
        conversation = self.store.conversations[message.conversation_id]
        template = message.template_params or {}
        return {
            "id": message.id,
            "account_id": message.account_id,
            "conversation_id": conversation.display_id,
            "conversation_internal_id": conversation.id,
            "inbox_id": message.inbox_id,
            "contact_id": message.contact_id,
            "message_type": message.message_type,
            "private": message.private,
            "content": message.content,
            "template_name": template.get("name"),
            "template_language": template.get("language"),
            "status": message.status,
            "highest_status": message.highest_status or message.status,
            "external_error": message.external_error,
            "source_id": message.source_id,
            "dispatched": message.dispatched,
            "created_at": message.created_at,
        }
