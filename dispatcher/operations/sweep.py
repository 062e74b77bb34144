"""The periodic sweep (Celery beat): the outbox relay, due scheduled rows, long waits, lost tasks.

Safe to run as often as wanted and from anywhere: it only hands IDs to the send queue, and the
send path ignores a notification that is not sendable or already held.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from dispatcher.enqueue import Enqueuer
from dispatcher.lifecycle import moves
from dispatcher.store import queries as store
from dispatcher.store.models import utcnow

BATCH = 500


def sweep(
    *, sessions: sessionmaker[Session], enqueuer: Enqueuer, stale_after_s: float, clock: Callable[[], datetime] = utcnow
) -> int:
    """Hand every due row to the queue; return how many were published."""
    now = clock()
    with sessions.begin() as session:
        ids = store.due_for_enqueue(session, now=now, stale_before=now - timedelta(seconds=stale_after_s), limit=BATCH)
        moves.release_due(session, ids, now=now)
    if not ids:
        return 0
    published = enqueuer.enqueue_send(ids)
    with sessions.begin() as session:
        store.mark_enqueued(session, published, now=clock())
    return len(published)
