"""Many business events at once (``Dispatcher.notify_many``, the HTTP batch): each item is handled
as :func:`dispatcher.intake.accept.accept` would handle it alone, with a result of its own.

An item is ``accepted`` (stored now), a ``duplicate`` (its event was handed over before with the
same request, here or in an earlier call: nothing new is stored) or ``refused`` (the field at
fault and the problem, as ``notify`` would raise them; nothing of it is stored). One bad item
refuses only itself.

The fast path stores every new item of a batch in one transaction with two statements (the
notifications, then their payloads) and publishes their send tasks in one broker batch, instead
of a transaction and a publish each. Items that need the store to decide them one at a time (a
capped route's count, a route's consent) take the single path; so does the whole batch when a
twin handed one of its events over meanwhile (the store's unique event ID refuses the insert).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.enqueue import Enqueuer
from dispatcher.errors import EventConflict, EventSpent, InvalidEvent
from dispatcher.intake.accept import (
    accept,
    category_of,
    check_request,
    new_trace,
    payload_of,
    priority_of,
    scheduled_for,
    workspace_settings,
)
from dispatcher.intake.request import NotificationRequest, parse_request
from dispatcher.lifecycle import moves
from dispatcher.queues import Priority, send_queue
from dispatcher.recipients.policy import needs_consent
from dispatcher.settings import Settings
from dispatcher.store import queries as store
from dispatcher.store.models import utcnow

MAX_BATCH = 1_000


class ItemOutcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REFUSED = "refused"


@dataclass(frozen=True)
class BatchItem:
    """What became of one item of a batch, at its position (``index``, from 0)."""

    index: int
    event_id: str | None  # None when the item had no readable event ID
    outcome: ItemOutcome
    state: str | None = None  # accepted or duplicate: the notification's state
    field: str | None = None  # refused: the field at fault, as InvalidEvent names it
    problem: str | None = None  # refused: what is wrong with it (never its value)


@dataclass(frozen=True)
class _Valid:
    index: int
    request: NotificationRequest
    fallback_route: str | None
    settings: Settings  # its workspace's


def accept_many(items: Sequence[object], *, sessions: sessionmaker[Session], settings: Settings, enqueuer: Enqueuer,
                clock: Callable[[], datetime] = utcnow) -> list[BatchItem]:
    """Hand over up to :data:`MAX_BATCH` requests; a result per item, in their order."""
    if len(items) > MAX_BATCH:
        raise InvalidEvent("notifications", f"at most {MAX_BATCH} in one batch, got {len(items)}")
    now = clock()
    results: dict[int, BatchItem] = {}
    valid = _checked(items, settings, now, results)
    with sessions() as session:
        known = store.stored_events(session, [item.request.event_id for item in valid])
        spent = _spent(session, [item.request.event_id for item in valid], settings, now)
    new: list[_Valid] = []
    for item in valid:
        event_id = item.request.event_id
        if event_id in known:
            fingerprint, state = known[event_id]
            if fingerprint != item.request.fingerprint():
                results[item.index] = _refused(item.index, event_id, EventConflict(event_id))
            else:
                results[item.index] = BatchItem(item.index, event_id, ItemOutcome.DUPLICATE, state=state)
        elif event_id in spent:
            results[item.index] = _refused(item.index, event_id, EventSpent(event_id))
        else:
            new.append(item)
    single = [item for item in new if _decided_one_by_one(item)]
    results.update(_store_together([item for item in new if item not in single], sessions, enqueuer, now))
    for item in single:
        results[item.index] = _one(item, sessions, enqueuer, clock)
    return [results[index] for index in range(len(items))]


def _checked(items: Sequence[object], settings: Settings, now: datetime, results: dict[int, BatchItem]) -> list[_Valid]:
    """The items that are valid requests, each event once (a repeat in the batch is a duplicate of
    its first, or refused when its request differs); the others get their results."""
    valid: list[_Valid] = []
    first: dict[str, _Valid] = {}
    for index, raw in enumerate(items):
        event_id = _event_id_of(raw)
        try:
            request = parse_request(raw)
            of_workspace = workspace_settings(settings, request.workspace)
            fallback_route = check_request(request, of_workspace, now=now)
        except InvalidEvent as invalid:
            results[index] = _refused(index, event_id, invalid)
            continue
        earlier = first.get(request.event_id)
        if earlier is None:
            first[request.event_id] = item = _Valid(index, request, fallback_route, of_workspace)
            valid.append(item)
        elif earlier.request.fingerprint() != request.fingerprint():
            results[index] = BatchItem(index, request.event_id, ItemOutcome.REFUSED, field="event_id",
                                       problem=f"the same event_id comes earlier in this batch (item {earlier.index}) "
                                               "with a different request")
        else:
            results[index] = BatchItem(index, request.event_id, ItemOutcome.DUPLICATE,
                                       problem=f"the same as item {earlier.index} of this batch")
    return valid


def _event_id_of(raw: object) -> str | None:
    event_id = raw.get("event_id") if isinstance(raw, dict) else getattr(raw, "event_id", None)
    return event_id if isinstance(event_id, str) and 0 < len(event_id) <= 200 and event_id.isprintable() else None


def _refused(index: int, event_id: str | None, invalid: InvalidEvent) -> BatchItem:
    return BatchItem(index, event_id, ItemOutcome.REFUSED, field=invalid.field, problem=invalid.problem)


def _spent(session: Session, event_ids: list[str], settings: Settings, now: datetime) -> set[str]:
    """The events among ``event_ids`` whose notifications retention purged within the horizon."""
    by_key = {store.event_key(event_id, key=settings.hashing_key): event_id for event_id in event_ids}
    return {by_key[key] for key in store.spent_event_keys(session, list(by_key), now=now)}


def _decided_one_by_one(item: _Valid) -> bool:
    """A capped route counts its recent hand-overs, and a route that needs consent looks it up or
    records it: both are decided in the store, one request at a time (the single path)."""
    routes = [item.settings.routes[name] for name in (item.request.route, item.fallback_route) if name is not None]
    return any(route.max_per_minute is not None or needs_consent(route, item.settings) for route in routes)


def _store_together(items: list[_Valid], sessions: sessionmaker[Session], enqueuer: Enqueuer,
                    now: datetime) -> dict[int, BatchItem]:
    if not items:
        return {}
    rows = [_row(item, now) for item in items]
    try:
        with sessions.begin() as session:
            ids = moves.create_many(session, rows)
            store.add_payloads(session, {ids[item.request.event_id]: payload_of(item.request, item.settings) for item in items})
    except IntegrityError:  # a twin stored one of these events meanwhile: each item decides alone
        return {item.index: _one(item, sessions, enqueuer, lambda: now) for item in items}
    lanes: dict[str, list[int]] = {}  # each queued row to its workspace's and priority's queue
    for row in rows:
        if row["enqueued_at"] is not None:
            lanes.setdefault(send_queue(row["workspace"], Priority(row["priority"])), []).append(ids[row["event_id"]])
    for queue, queued in lanes.items():
        published = set(enqueuer.enqueue_send(queued, queue=queue))
        if len(published) < len(queued):
            with sessions.begin() as session:  # the broker refused: the next sweep publishes them
                store.forget_enqueued(session, [i for i in queued if i not in published], marked_at=now)
    return {item.index: BatchItem(item.index, row["event_id"], ItemOutcome.ACCEPTED,
                                  state=moves.created_state(row["send_at"]))
            for item, row in zip(items, rows, strict=True)}


def _row(item: _Valid, now: datetime) -> dict[str, Any]:
    """The notification's columns, for the one insert of the batch."""
    request, settings = item.request, item.settings
    send_at = scheduled_for(request, settings, now=now)
    return {
        "event_id": request.event_id, "fingerprint": request.fingerprint(), "route": request.route,
        "fallback_route": item.fallback_route, "channel": settings.routes[request.route].channel.value,
        "category": category_of(request, settings), "send_at": send_at, "created_at": now, "updated_at": now,
        "workspace": settings.workspace_name, "priority": priority_of(request, settings).value,
        # queued rows are published right after the commit, as accept() does; scheduled ones wait for the sweep
        "enqueued_at": now if send_at is None else None,
        "trace_parent": new_trace(request, settings),
    }


def _one(item: _Valid, sessions: sessionmaker[Session], enqueuer: Enqueuer, clock: Callable[[], datetime]) -> BatchItem:
    event_id = item.request.event_id
    with sessions() as session:
        existed = store.find_notification_by_event(session, event_id) is not None
    try:
        record = accept(item.request, sessions=sessions, settings=item.settings, enqueuer=enqueuer, clock=clock)
    except InvalidEvent as invalid:
        return _refused(item.index, event_id, invalid)
    outcome = ItemOutcome.DUPLICATE if existed else ItemOutcome.ACCEPTED
    return BatchItem(item.index, event_id, outcome, state=record.state)

