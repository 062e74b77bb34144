"""The baseline for scripts/bench/send_path.py: the dispatcher's own Celery app and settings,
with one task that does nothing but count itself done (and, for scripts/bench/latency.py, one
that records the time from its publication to its end)."""

from __future__ import annotations

import os
import time

import redis

from dispatcher.settings import load_settings
from workers.app import create_app

app = create_app(load_settings())
_counter = redis.Redis.from_url(os.environ["BENCH_COUNTER_URL"])


@app.task(name="bench.noop", ignore_result=True)
def noop(number: int) -> None:
    """Record the first start and count the task done: the bench reads both from Redis."""
    _counter.set("bench:noop:first", time.time(), nx=True)
    _counter.incr("bench:noop:done")
    _counter.set("bench:noop:last", time.time())


@app.task(name="bench.noop_timed", ignore_result=True)
def noop_timed(published_at: float) -> None:
    """The latency baseline (scripts/bench/latency.py): seconds from publication to this task's end."""
    _counter.rpush("bench:noop:latency", time.time() - published_at)
