"""The periodic sweep (Celery beat): the outbox relay, due scheduled rows, long waits, lost tasks.

Safe to run as often as wanted and from anywhere: each batch is taken in one transaction that
marks its rows enqueued before they are published (on PostgreSQL, rows another sweep holds are
skipped), so sweeps in several processes publish disjoint batches; and the send path ignores a
notification that is not sendable or already held. A publish that fails gives its rows back to
the next sweep.

One task per waiting row (issue 44). A row's task is published once and then left to the broker:
a worker that dies gives its task back (late acks: Redis after the visibility timeout, RabbitMQ
at once), so neither a row's age in a backlog nor a worker's death is a reason to publish again.
The sweep publishes a row again only when its task cannot be anywhere:

- a run touched the row (``task_started``) and its lease lapsed, ``stale_after_s`` after the last
  touch: the task ended by an exception and was acknowledged while the row stayed sendable;
- the row was published and not started, for longer than ``stale_after_s``, and the send queue
  was empty when this sweep began: its task is in no queue, so it is held by a worker about to
  start it (one task a pool process: prefetch multiplier 1), or it was lost. Lost means the
  publisher died between its commit and its publish (the relay here, intake, a fallback
  decision), or a broker without persistence restarted (Redis loses every queued and
  unacknowledged task). Either way exactly one task per lost row: the republished tasks fill the
  queue again, and no row is taken twice before it has drained.

The price: a task lost while a backlog waits is published again only once the queue has
drained, not ``stale_after_s`` after it was lost. The alternatives weighed (docs/operations.md,
"One task per waiting row"): a broker epoch (Redis's run_id) finds a restart at once but not a
publisher that died, and is Redis's alone; publishing inside the marking transaction lets the
task run before the row it names is committed; a second write after each publish (published,
confirmed) would cost intake a transaction per notification. The depth is one read per sweep,
on every broker kombu speaks to.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from dispatcher.enqueue import RelayEnqueuer
from dispatcher.lifecycle import moves, worklists
from dispatcher.queues import Priority, send_queue
from dispatcher.store import queries as store
from dispatcher.store.models import utcnow

BATCH = 500
DEFAULT_BUDGET_S = 4.0  # the worker passes 0.8 x the beat interval: one sweep seldom overlaps the next


def sweep(
    *, sessions: sessionmaker[Session], enqueuer: RelayEnqueuer, stale_after_s: float,
    clock: Callable[[], datetime] = utcnow, budget_s: float = DEFAULT_BUDGET_S,
) -> int:
    """Hand every due row to the queue, batch after batch for up to ``budget_s``; return how many
    were published. A backlog larger than the budget allows is the next sweep's."""
    started = time.monotonic()
    queue_empty = send_queue_empty(enqueuer)
    total = 0
    while True:
        taken, published = _relay_one_batch(sessions, enqueuer, stale_after_s=stale_after_s, now=clock(),
                                            queue_empty=queue_empty)
        total += published
        if taken < BATCH or published < taken or time.monotonic() - started >= budget_s:
            return total  # drained, the broker refused some (try later), or out of time


def send_queue_empty(enqueuer: RelayEnqueuer) -> bool:
    """Whether no send task waits in the broker's queue, read once, before any row is read: a task
    published after this read belongs to a row too young to be taken as lost. A broker that cannot
    tell counts as empty, so that nothing stays lost (a twin task is harmless, a lost one is not)."""
    depth = enqueuer.send_queue_depth()
    return depth is None or depth == 0


def _relay_one_batch(sessions: sessionmaker[Session], enqueuer: RelayEnqueuer, *, stale_after_s: float,
                     now: datetime, queue_empty: bool) -> tuple[int, int]:
    with sessions.begin() as session:
        rows = worklists.due_for_enqueue(session, now=now, stale_before=now - timedelta(seconds=stale_after_s), limit=BATCH,
                                         send_queue_empty=queue_empty)
        ids = [row.id for row in rows]
        moves.release_due(session, ids, now=now)
        store.mark_enqueued(session, ids, now=now)  # taken: no other sweep publishes them meanwhile
    if not ids:
        return 0, 0
    published: list[int] = []
    for queue, lane_ids in lanes_of(rows).items():  # urgent lanes first: the rows come so ordered
        published += enqueuer.enqueue_send(lane_ids, queue=queue)
    if len(published) < len(ids):
        with sessions.begin() as session:
            store.forget_enqueued(session, set(ids) - set(published), marked_at=now)
    return len(ids), len(published)


def lanes_of(rows: list[worklists.DueRow]) -> dict[str, list[int]]:
    """The rows' IDs by the queue of their workspace and priority, in the rows' order."""
    lanes: dict[str, list[int]] = {}
    for row in rows:
        lanes.setdefault(send_queue(row.workspace, Priority(row.priority)), []).append(row.id)
    return lanes
