"""A worker that gave up ends within a bound, so that its supervisor starts it again.

When its event loop raises, Celery logs "Unrecoverable error" and stops warmly: it waits for the
pool's children to finish. A pool child killed halfway through writing a result leaves a torn
message that the main process cannot unpickle (celery/celery#2294, #2171); after that no loop
reads the other children's results, so the warm stop can wait forever, and a process that hangs
alive is one that no supervisor restarts. The chaos run met exactly this on RabbitMQ.

This step gives such a stop as long as a lease lasts (``stale_after_s``: past it the sweeps take
the work back anyway) and then ends the process and its pool with Celery's failure exit code, as
a crash would: no orphaned child goes on working for a parent that is gone. Tasks are
acknowledged late, so whatever the process held goes back to the broker.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from billiard.process import active_children
from celery import bootsteps
from celery.platforms import EX_FAILURE

logger = logging.getLogger(__name__)


class BoundedStopAfterFailure(bootsteps.StartStopStep):  # type: ignore[misc]
    """Arms a timer when the worker closes after a failure; a clean shutdown is left alone."""

    label = "bounded stop after failure"

    def close(self, parent: Any) -> None:
        # Steps close before any of them stops, so the timer runs before the waits it bounds.
        if parent.exitcode != EX_FAILURE:
            return  # a shutdown asked for (SIGTERM, SIGINT): it may wait for the tasks in flight
        from workers import runtime

        bound_s = runtime.settings().stale_after_s
        timer = threading.Timer(bound_s, _end_now, args=(bound_s,))
        timer.daemon = True
        timer.start()


def _end_now(bound_s: float) -> None:
    logger.critical("the worker did not stop within %.0f s of an unrecoverable error; it exits with code %d "
                    "for its supervisor to start it again", bound_s, EX_FAILURE)
    for handler in logging.getLogger().handlers:
        handler.flush()
    for child in active_children():
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it ended on its own meanwhile
    os._exit(EX_FAILURE)
