"""Which broker for the embedded setup (no server)? Kombu's SQLAlchemy transport over a SQLite
file against Kombu's filesystem transport, with the dispatcher's own Celery app and settings.

For each: the latency of one no-op task (publish to done, median of 20, one at a time) and the
throughput of 300 queued before the worker starts (first start to last end). A Redis counter
records the times (the harness only; the brokers under test need no server).

    .venv/bin/python scripts/bench/embedded_broker.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import private_redis  # noqa: E402  (scripts/bench/common.py, beside this script)


def measure(broker_url: str, workdir: Path, counter_url: str) -> dict[str, float]:
    env = {**os.environ, "DISPATCHER_CONFIG": str(REPO / "config" / "dispatcher.example.toml"),
           "DISPATCHER_BROKER_URL": broker_url, "BENCH_COUNTER_URL": counter_url, "PYTHONPATH": str(REPO),
           # a worker on the SQL broker refuses to start without a shared limiter (dispatcher.context)
           "DISPATCHER_REDIS_URL": counter_url}
    os.environ.update(env)
    from celery import Celery

    from dispatcher.queues import SEND_QUEUE, broker_transport, broker_transport_options

    counter = redis.Redis.from_url(counter_url)
    counter.flushdb()
    producer = Celery("bench", broker=broker_url, set_as_current=False)
    producer.conf.broker_transport = broker_transport(broker_url)
    producer.conf.broker_transport_options = broker_transport_options(broker_url)
    tasks = 300
    for number in range(tasks):
        producer.send_task("bench.noop", args=[number], queue=SEND_QUEUE)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "scripts.bench.noop_app", "worker", "--queues", SEND_QUEUE,
         "--concurrency", "2", "--loglevel", "WARNING", "--without-gossip", "--without-mingle"],
        cwd=REPO, env=env, stdout=open(workdir / "worker.log", "wb"), stderr=subprocess.STDOUT,
    )
    try:
        _wait(lambda: int(counter.get("bench:noop:done") or 0) >= tasks)
        throughput = tasks / (float(counter.get("bench:noop:last")) - float(counter.get("bench:noop:first")))
        latencies = []
        for number in range(20):
            done = int(counter.get("bench:noop:done") or 0)
            started = time.perf_counter()
            producer.send_task("bench.noop", args=[number], queue=SEND_QUEUE)
            _wait(lambda before=done: int(counter.get("bench:noop:done") or 0) > before)
            latencies.append(time.perf_counter() - started)
        return {"tasks_per_s": round(throughput, 1), "latency_median_ms": round(statistics.median(latencies) * 1000, 1)}
    finally:
        worker.terminate()
        worker.wait(timeout=20)


def _wait(condition: object) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.005)
    raise TimeoutError("timed out")


def main() -> None:
    results = {}
    for name, url in (("sqlalchemy+sqlite", "sqla+sqlite:///{dir}/broker.sqlite"), ("filesystem", "filesystem:///{dir}/broker")):
        with tempfile.TemporaryDirectory() as workdir, private_redis() as counter_url:
            results[name] = measure(url.format(dir=workdir), Path(workdir), counter_url)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
