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
from celery.signals import worker_shutting_down

logger = logging.getLogger(__name__)


_stop_asked_for = threading.Event()  # a signal asked this process to stop (SIGTERM, SIGINT, SIGQUIT)


@worker_shutting_down.connect
def _note_stop_asked_for(**_: object) -> None:
    _stop_asked_for.set()


def stop_bound_s(exitcode: int | None, *, asked_for: bool, stale_after_s: float) -> float | None:
    """How long the worker's stop may last before the process ends itself: None, no bound, for a
    stop a signal asked for (Ctrl-C also stops with the failure code, and waits for the tasks in
    flight as Celery documents); a lease's length after an error the worker could not survive."""
    if exitcode != EX_FAILURE or asked_for:
        return None
    return stale_after_s


class BoundedStopAfterFailure(bootsteps.StartStopStep):  # type: ignore[misc]
    """Arms a timer when the worker closes after a failure; a shutdown asked for is left alone."""

    label = "bounded stop after failure"

    def close(self, parent: Any) -> None:
        # Steps close before any of them stops, so the timer runs before the waits it bounds.
        from workers import runtime

        bound_s = stop_bound_s(parent.exitcode, asked_for=_stop_asked_for.is_set(),
                               stale_after_s=runtime.settings().stale_after_s)
        if bound_s is None:
            return
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
