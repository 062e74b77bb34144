"""After an ambiguous createMessage, find the message we may have sent instead of sending again.

The service has no idempotency key on createMessage (field notes): a timeout, a dropped
connection or a worker killed mid-call leaves us not knowing whether the message exists. We
read the conversation's messages, newest first, back to a little before the attempt started,
and adopt an outgoing message whose content hash is ours and that no other attempt adopted.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from dispatcher.api import Message
from dispatcher.api.paging import iter_messages
from dispatcher.api.records import MessageType
from dispatcher.context import SendContext, call_api
from dispatcher.store import queries as store

CLOCK_SKEW = timedelta(minutes=2)  # the service's clock against ours
MAX_PAGES = 5  # 100 messages: a conversation busier than that within minutes is not ours to scan
OUTGOING_TYPES = frozenset({MessageType.OUTGOING, MessageType.TEMPLATE})


def find_sent_message(ctx: SendContext, *, conversation_id: int, content_hash: str, since: datetime) -> Message | None:
    """The oldest unadopted outgoing message in the conversation with our content, sent since ``since``."""

    def scan() -> list[Message]:
        found = []
        for message in iter_messages(ctx.api, conversation_id, max_pages=MAX_PAGES):
            if message.created_at is not None and message.created_at < since - CLOCK_SKEW:
                break  # newest first: everything further back is older still
            if message.message_type in OUTGOING_TYPES and message.content is not None:
                if store.content_hash(message.content) == content_hash:
                    found.append(message)
        return found

    candidates = call_api(ctx, scan)
    with ctx.sessions() as session:
        for message in sorted(candidates, key=lambda candidate: candidate.id):
            if not store.message_adopted_elsewhere(session, ctx.settings.workspace_name, message.id):
                return message
    return None
