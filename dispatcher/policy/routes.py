"""Which inbox a route sends through: pure functions over the settings and the inbox list."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from dispatcher.settings import Route


class InboxLike(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str | None: ...


InboxT = TypeVar("InboxT", bound=InboxLike)


def find_route_inbox(route: Route, inboxes: Iterable[InboxT]) -> InboxT | None:
    """The inbox a route names, by id or by exact name; None when the workspace has none such.

    A name that matches several inboxes is ambiguous and resolves to none: sending through
    the wrong inbox is worse than not sending.
    """
    candidates = list(inboxes)
    if route.inbox_id is not None:
        return next((inbox for inbox in candidates if inbox.id == route.inbox_id), None)
    named = [inbox for inbox in candidates if inbox.name == route.inbox_name]
    return named[0] if len(named) == 1 else None
