"""How many notifications wait for a worker, and whether HTTP intake should push back.

Past capacity, accepting more only lengthens the queue: every new notification waits behind the
backlog, and a host that is told nothing keeps pushing. With ``intake_max_backlog`` notifications
queued (due and not yet claimed by a worker), HTTP intake answers 429 with ``Retry-After``; the
host hands the same events over again later (the event ID makes that safe). Scheduled
notifications are not backlog: they wait for their time, not for a worker.

The count is one indexed ``count(*)``, made at most once a second per process, so intake under
load pays for it once a second rather than once a request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from dispatcher.lifecycle.worklists import count_waiting_for_a_worker

RECOUNT_AFTER_S = 1.0


class BacklogGate:
    """``is_full()``: whether the backlog has reached ``max_backlog`` (0: never)."""

    def __init__(self, sessions: sessionmaker[Session], *, max_backlog: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions = sessions
        self._max_backlog = max_backlog
        self._clock = clock
        self._lock = threading.Lock()
        self._counted_at: float | None = None
        self._backlog = 0

    @property
    def enabled(self) -> bool:
        return self._max_backlog > 0

    def is_full(self) -> bool:
        if not self.enabled:
            return False
        now = self._clock()
        stale = self._counted_at is None or now - self._counted_at >= RECOUNT_AFTER_S
        # One count at a time, and nobody waits for it: while one request counts, the others use
        # the last answer. A store that hangs then holds one request, not every one in a queue.
        if stale and self._lock.acquire(blocking=False):
            try:
                self._counted_at = now  # a count that fails is not retried for a second either
                with self._sessions() as session:
                    self._backlog = count_waiting_for_a_worker(session)
            finally:
                self._lock.release()
        return self._backlog >= self._max_backlog
