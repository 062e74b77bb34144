"""The periodic sweep (Celery beat): the outbox relay, due scheduled rows, long waits, lost tasks.

Safe to run as often as wanted and from anywhere: each batch is taken in one transaction that
marks its rows enqueued before they are published (on PostgreSQL, rows another sweep holds are
skipped), so sweeps in several processes publish disjoint batches; and the send path ignores a
notification that is not sendable or already held. A publish that fails gives its rows back to
the next sweep; a sweep that dies between its commit and its publish leaves them to the stale
check (``stale_after_s``), as a lost task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from dispatcher.enqueue import Enqueuer
from dispatcher.lifecycle import moves
from dispatcher.store import queries as store
from dispatcher.store.models import utcnow

BATCH = 500
DEFAULT_BUDGET_S = 4.0  # the worker passes 0.8 x the beat interval: one sweep seldom overlaps the next


def sweep(
    *, sessions: sessionmaker[Session], enqueuer: Enqueuer, stale_after_s: float, clock: Callable[[], datetime] = utcnow,
    budget_s: float = DEFAULT_BUDGET_S,
) -> int:
    """Hand every due row to the queue, batch after batch for up to ``budget_s``; return how many
    were published. A backlog larger than the budget allows is the next sweep's."""
    started = time.monotonic()
    total = 0
    while True:
        taken, published = _relay_one_batch(sessions, enqueuer, stale_after_s=stale_after_s, now=clock())
        total += published
        if taken < BATCH or published < taken or time.monotonic() - started >= budget_s:
            return total  # drained, the broker refused some (try later), or out of time


def _relay_one_batch(sessions: sessionmaker[Session], enqueuer: Enqueuer, *, stale_after_s: float,
                     now: datetime) -> tuple[int, int]:
    with sessions.begin() as session:
        ids = store.due_for_enqueue(session, now=now, stale_before=now - timedelta(seconds=stale_after_s), limit=BATCH)
        moves.release_due(session, ids, now=now)
        store.mark_enqueued(session, ids, now=now)  # taken: no other sweep publishes them meanwhile
    if not ids:
        return 0, 0
    published = enqueuer.enqueue_send(ids)
    if len(published) < len(ids):
        with sessions.begin() as session:
            store.forget_enqueued(session, set(ids) - set(published), marked_at=now)
    return len(ids), len(published)
