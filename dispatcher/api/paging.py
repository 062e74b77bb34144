"""Bounded iteration over the paged operations.

Every iterator stops at ``max_pages`` requests even when the service says there is more (or
ignores the page parameter): a runaway loop would burn the rate limit (contact search: 100 a
minute per account). Reaching the cap logs a WARNING with the operation and page count only
and ends the iteration; the caller sees fewer results, never an endless loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from dispatcher.api.client import WorkspaceClient
from dispatcher.api.records import Contact, Conversation, Message

__all__ = ["iter_conversations", "iter_messages", "iter_search_results"]

_log = logging.getLogger(__name__)


def _capped(operation: str, max_pages: int) -> None:
    _log.warning("%s: stopped after max_pages=%d pages", operation, max_pages)


def _check(max_pages: int) -> int:
    if isinstance(max_pages, bool) or not isinstance(max_pages, int) or max_pages < 1:
        raise ValueError("max_pages must be a positive integer")
    return max_pages


def iter_search_results(client: WorkspaceClient, q: str, *, max_pages: int = 10) -> Iterator[Contact]:
    """Contacts matching ``q`` (substring match), page by page, at most ``max_pages`` requests.

    Stops when the service says ``has_more`` is false, or, when it does not say, at the first
    empty page.
    """
    for page in range(1, _check(max_pages) + 1):
        result = client.search_contacts(q, page=page)
        yield from result.contacts
        if result.has_more is False or not result.contacts:
            return
    _capped("searchContacts", max_pages)


def iter_conversations(client: WorkspaceClient, *, inbox_id: int | None = None,
                       status: str = "open", max_pages: int = 20) -> Iterator[Conversation]:
    """Conversations page by page until an empty page, at most ``max_pages`` requests."""
    for page in range(1, _check(max_pages) + 1):
        result = client.list_conversations(inbox_id=inbox_id, status=status, page=page)
        if not result.conversations:
            return
        yield from result.conversations
    _capped("listConversations", max_pages)


def iter_messages(client: WorkspaceClient, conversation_id: int, *,
                  max_pages: int = 10) -> Iterator[Message]:
    """A conversation's messages, NEWEST FIRST, paging back with ``before=<oldest id seen>``.

    At most ``max_pages`` requests (20 messages each by default). Stops at an empty page or
    when a page brings nothing older than what was already seen (the service ignored
    ``before``).
    """
    before: int | None = None
    for _ in range(_check(max_pages)):
        page = client.list_messages(conversation_id, before=before)
        older = [m for m in page.messages if before is None or m.id < before]
        if not older:
            return
        older.sort(key=lambda m: m.id, reverse=True)
        yield from older
        before = older[-1].id
    _capped("listMessages", max_pages)
