"""The callbacks table as the delivery task and the operator use it: take what is due, record
what became of each, park and resume a paused URL's events, replay a notification's events."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from dispatcher.store.db import insert_for
from dispatcher.store.models import Callback, CallbackEndpoint, table_of

CALLBACKS = table_of(Callback)
ENDPOINTS = table_of(CallbackEndpoint)
PENDING, DELIVERED, EXPIRED = "pending", "delivered", "expired"
DETAIL_MAX_CHARS = 200


@dataclass(frozen=True)
class DueCallback:
    id: int
    event_id: str
    route: str
    workspace: str
    type: str
    attempt: int
    state: str
    channel: str | None
    error_kind: str | None
    sequence: int
    occurred_at: datetime
    tries: int


def url_key(url: str) -> str:
    """How a URL is kept at rest and in logs: its sha256 (a URL may carry a token)."""
    return hashlib.sha256(url.encode()).hexdigest()


def take_due(session: Session, *, now: datetime, hold_until: datetime, limit: int) -> list[DueCallback]:
    """Up to ``limit`` pending events due now, oldest first, for this task alone: their next try
    moves to ``hold_until`` in this transaction (on PostgreSQL, rows another task holds are
    skipped), so tasks in several processes deliver disjoint batches."""
    due = (select(CALLBACKS.c.id).where(CALLBACKS.c.status == PENDING, CALLBACKS.c.next_try_at <= now)
           .order_by(CALLBACKS.c.next_try_at, CALLBACKS.c.id).limit(limit))
    if session.get_bind().dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    ids = list(session.scalars(due))
    if not ids:
        return []
    rows = session.execute(
        update(CALLBACKS).where(CALLBACKS.c.id.in_(ids)).values(next_try_at=hold_until)
        .returning(CALLBACKS.c.id, CALLBACKS.c.event_id, CALLBACKS.c.route, CALLBACKS.c.workspace, CALLBACKS.c.type,
                   CALLBACKS.c.attempt,
                   CALLBACKS.c.state, CALLBACKS.c.channel, CALLBACKS.c.error_kind, CALLBACKS.c.sequence,
                   CALLBACKS.c.occurred_at, CALLBACKS.c.tries)
    ).all()
    return sorted((DueCallback(*row) for row in rows), key=lambda row: row.id)


def delivered(session: Session, ids: Iterable[int], *, now: datetime) -> None:
    chosen = list(ids)
    if chosen:
        session.execute(update(CALLBACKS).where(CALLBACKS.c.id.in_(chosen), CALLBACKS.c.status == PENDING)
                        .values(status=DELIVERED, delivered_at=now, tries=CALLBACKS.c.tries + 1, next_try_at=None,
                                last_error=None))


def failed(session: Session, callback_id: int, *, error: str, next_try_at: datetime) -> None:
    session.execute(update(CALLBACKS).where(CALLBACKS.c.id == callback_id, CALLBACKS.c.status == PENDING)
                    .values(tries=CALLBACKS.c.tries + 1, next_try_at=next_try_at, last_error=error[:DETAIL_MAX_CHARS]))


def expired(session: Session, callback_id: int, *, reason: str) -> None:
    session.execute(update(CALLBACKS).where(CALLBACKS.c.id == callback_id, CALLBACKS.c.status == PENDING)
                    .values(status=EXPIRED, next_try_at=None, last_error=reason[:DETAIL_MAX_CHARS]))


def parked(session: Session, ids: Iterable[int]) -> None:
    """Events of a paused URL wait, with no due time, until the URL is resumed."""
    chosen = list(ids)
    if chosen:
        session.execute(update(CALLBACKS).where(CALLBACKS.c.id.in_(chosen), CALLBACKS.c.status == PENDING)
                        .values(next_try_at=None))


def paused_keys(session: Session) -> set[str]:
    return set(session.scalars(select(ENDPOINTS.c.url_key).where(ENDPOINTS.c.paused_at.is_not(None))))


def endpoint_answered(session: Session, key: str) -> None:
    session.execute(update(ENDPOINTS).where(ENDPOINTS.c.url_key == key, ENDPOINTS.c.paused_at.is_(None))
                    .values(failing_since=None, reason=None))


def endpoint_failed(session: Session, key: str, *, now: datetime, error: str, pause_after: timedelta) -> bool:
    """Note a failed delivery to the URL; pause it when it has failed every delivery for
    ``pause_after``. True when this pauses it. Safe beside another run doing the same."""
    inserted = session.execute(
        insert_for(session)(ENDPOINTS).values(url_key=key, failing_since=now, reason=error[:DETAIL_MAX_CHARS])
        .on_conflict_do_nothing()
    )
    if _count(inserted):
        return False
    since = session.execute(
        update(ENDPOINTS).where(ENDPOINTS.c.url_key == key, ENDPOINTS.c.paused_at.is_(None))
        .values(failing_since=func.coalesce(ENDPOINTS.c.failing_since, now), reason=error[:DETAIL_MAX_CHARS])
        .returning(ENDPOINTS.c.failing_since)
    ).scalar_one_or_none()
    if since is None or now - since < pause_after:
        return False
    reason = f"failing every delivery since {since.isoformat(timespec='seconds')}: {error}"
    return _count(session.execute(
        update(ENDPOINTS).where(ENDPOINTS.c.url_key == key, ENDPOINTS.c.paused_at.is_(None))
        .values(paused_at=now, reason=reason[:DETAIL_MAX_CHARS])
    )) == 1


def resume(session: Session, *, now: datetime) -> tuple[int, int]:
    """An operator resumes every paused URL: the events held for it are due now; others keep their
    schedule (and a running task's lease). (URLs resumed, events due)."""
    resumed = _count(session.execute(delete(ENDPOINTS).where(ENDPOINTS.c.paused_at.is_not(None))))
    due = _count(session.execute(update(CALLBACKS).where(CALLBACKS.c.status == PENDING, CALLBACKS.c.next_try_at.is_(None))
                                 .values(next_try_at=now)))
    return resumed, due


def replay(session: Session, event_id: str, *, now: datetime) -> int:
    """Deliver every event of one notification again, under the same IDs (a host de-duplicates)."""
    return _count(session.execute(
        update(CALLBACKS).where(CALLBACKS.c.event_id == event_id)
        .values(status=PENDING, next_try_at=now, tries=0, last_error=None, delivered_at=None)
    ))


def _count(result: Any) -> int:
    return int(result.rowcount or 0)


def listed(session: Session, *, status: str | None, limit: int) -> list[Callback]:
    query = select(Callback).order_by(Callback.id.desc()).limit(limit)
    if status is not None:
        query = query.where(Callback.status == status)
    return list(session.scalars(query))


def endpoints(session: Session) -> list[CallbackEndpoint]:
    return list(session.scalars(select(CallbackEndpoint).order_by(CallbackEndpoint.url_key)))
