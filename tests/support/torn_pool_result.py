"""Loaded into a test's Celery worker with ``--include``: its main process fails as it does when a
pool child dies halfway through writing a result (celery/celery#2294).

The main process reads the FIFO named by ``TEST_TORN_RESULT_FIFO`` in its event loop; a byte written
there raises, from a reader callback of the hub, the error that Celery's result reader raises on a
torn message. The task ``test.hold`` keeps a pool child busy, as a send in flight would, so that
a warm stop has something to wait for.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

from celery.signals import worker_ready

from workers.app import app

HOLD_TASK = "test.hold"


@app.task(name=HOLD_TASK)
def hold(started_marker: str) -> None:
    Path(started_marker).write_text(str(os.getpid()))
    time.sleep(600)


@worker_ready.connect
def _read_the_fifo(sender: Any, **_: object) -> None:
    # Read and write: the FIFO then never reports a hang-up, only the byte the test writes.
    fifo = os.open(os.environ["TEST_TORN_RESULT_FIFO"], os.O_RDWR | os.O_NONBLOCK)

    def torn_result() -> None:
        os.read(fifo, 1)
        raise pickle.UnpicklingError("pickle data was truncated")

    sender.hub.add_reader(fifo, torn_result)
