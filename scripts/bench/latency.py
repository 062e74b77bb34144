"""Intake-to-accepted latency at a steady rate, p50 and p99; past capacity, what the worker sustains.

The dispatcher: one real Celery worker (the same settings as scripts/bench/send_path.py:
prefork, ``--concurrency`` processes, Redis broker, PostgreSQL store), ``--contacts`` known
contacts (warmed first, so every send is a warm-path send, as in the capacity figure). Then
this process hands notifications over with ``notify()`` at ``--rate`` a second, evenly spaced,
for ``--seconds``, from ``--intake-threads`` threads (as a host's request threads would).
Latency per notification, from PostgreSQL: ``attempts.accepted_at -
notifications.created_at`` (intake's start to the acceptance record after createMessage).

The baseline, in the same run: a no-op Celery task (scripts/bench/noop_app.py) published at the
same rate for the same time, on the same broker and worker settings; its latency is
publication to the task's end. It is the queueing floor: what Celery alone costs at that load.

    .venv/bin/python scripts/bench/latency.py --rate 65 --seconds 60

Offered past capacity (``scripts/bench/all`` offers twice figure 1's rate), the worker falls
behind and drains the backlog afterwards: the run reports the rate it sustained while intake ran
(acceptances between the first hand-over and the last), the capacity with intake beside it, and
that every notification was accepted once, none refused and none sent twice (the sandbox's
messages by event). ``all`` then offers 80 % of that capacity.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401
from common import (
    BENCH_SANDBOX,
    REPO,
    accepted_count,
    cpu_ms_per_item,
    cpu_seconds,
    emit,
    environment,
    percentile,
    private_redis,
    reminder,
    settings_from,
    start_worker,
    stop,
    temp_database,
    wait_until,
)


def paced(rate: float, seconds: float, action: Any, *, threads: int = 1) -> dict[str, float]:
    """Start ``action(i)`` at ``rate`` a second for ``seconds``, on ``threads`` threads (a host
    application's request threads), so that one slow hand-over does not hold the next one."""
    from concurrent.futures import ThreadPoolExecutor

    total = round(rate * seconds)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        started = time.perf_counter()
        futures = []
        for i in range(total):
            wait = started + i / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            futures.append(pool.submit(action, i))
        for future in futures:
            future.result()
    elapsed = time.perf_counter() - started
    return {"handed_over": total, "seconds": round(elapsed, 2), "achieved_rate": round(total / elapsed, 1),
            "intake_threads": threads}


def summary(latencies_s: list[float]) -> dict[str, float]:
    ms = [value * 1000 for value in latencies_s]
    return {"count": len(ms), "p50_ms": round(percentile(ms, 0.50), 1), "p90_ms": round(percentile(ms, 0.90), 1),
            "p99_ms": round(percentile(ms, 0.99), 1), "max_ms": round(max(ms), 1) if ms else float("nan"),
            "percentiles_ms": {str(p): round(percentile(ms, p / 100), 2) for p in (*range(1, 100), 99.5, 99.9)}}


def run_baseline(env: dict[str, str], workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    import redis
    from celery import Celery

    from dispatcher.queues import SEND_QUEUE, broker_transport, broker_transport_options

    env = {**env, "BENCH_COUNTER_URL": env["DISPATCHER_BROKER_URL"],
           "PYTHONPATH": f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"}
    counter = redis.Redis.from_url(env["BENCH_COUNTER_URL"])
    counter.delete("bench:noop:latency")
    producer = Celery("bench", broker=env["DISPATCHER_BROKER_URL"], set_as_current=False)
    producer.conf.broker_transport = broker_transport(env["DISPATCHER_BROKER_URL"])
    producer.conf.broker_transport_options = broker_transport_options(env["DISPATCHER_BROKER_URL"])
    worker = start_worker(env, workdir / "noop.log", concurrency=args.concurrency, app="scripts.bench.noop_app", name="noop")
    try:
        # the worker is up when a first task comes back
        producer.send_task("bench.noop_timed", args=[time.time()], queue=SEND_QUEUE)
        wait_until(lambda: counter.llen("bench:noop:latency") >= 1, timeout_s=60, what="the no-op worker")
        counter.delete("bench:noop:latency")
        pacing = paced(args.rate, args.seconds,
                       lambda i: producer.send_task("bench.noop_timed", args=[time.time()], queue=SEND_QUEUE),
                       threads=args.intake_threads)
        total = pacing["handed_over"]
        wait_until(lambda: counter.llen("bench:noop:latency") >= total, timeout_s=120, what="the no-op tasks")
        latencies = [float(v) for v in counter.lrange("bench:noop:latency", 0, -1)]
    finally:
        stop(worker)
        producer.close()
    return {**pacing, **summary(latencies)}


def run_ours(env: dict[str, str], workdir: Path, args: argparse.Namespace, sandbox: Any) -> dict[str, Any]:
    import sqlalchemy as sa

    from dispatcher.enqueue import CeleryEnqueuer
    from dispatcher.service import Dispatcher
    from dispatcher.store.migrate import upgrade_database

    upgrade_database(env["DISPATCHER_DATABASE_URL"])
    dispatcher = Dispatcher(settings_from(env), enqueuer=CeleryEnqueuer(env["DISPATCHER_BROKER_URL"]))
    engine = dispatcher.sessions.kw["bind"]
    worker = start_worker(env, workdir / "worker.log", concurrency=args.concurrency)
    try:
        for contact in range(args.contacts):  # warm: every contact known, source_id and conversation stored
            dispatcher.notify(reminder(f"warm-{contact}", contact))
        wait_until(lambda: accepted_count(engine, "warm-") >= args.contacts, timeout_s=300, what="the warm-up")
        cpu_before = cpu_seconds([worker.pid])
        refused: list[str] = []

        def hand_over(i: int) -> None:
            try:
                dispatcher.notify(reminder(f"lat-{i}", i % args.contacts))
            except Exception as error:  # counted, not raised: "no error" is a figure of the overload run
                refused.append(type(error).__name__)

        pacing = paced(args.rate, args.seconds, hand_over, threads=args.intake_threads)
        total = pacing["handed_over"] - len(refused)
        done = wait_until(lambda: accepted_count(engine, "lat-") >= total, timeout_s=args.wait, what="every notification accepted",
                          interval_s=0.5)
        cpu = cpu_ms_per_item(cpu_before, cpu_seconds([worker.pid]), total)
    finally:
        stop(worker)
    with engine.connect() as connection:
        latencies = [float(v) for v in connection.execute(sa.text(
            "SELECT EXTRACT(EPOCH FROM a.accepted_at - n.created_at) FROM notifications n"
            " JOIN attempts a ON a.notification_id = n.id AND a.number = 1"
            " WHERE n.event_id LIKE 'lat-%' AND a.accepted_at IS NOT NULL")).scalars()]
        # What the worker sustained while intake ran beside it: acceptances between the first
        # hand-over and the last, over that time. Past capacity the queue never empties then, so
        # this is the capacity with intake running (the drain afterwards, with the cores to
        # itself, would overstate it).
        first, last, accepted, during = connection.execute(sa.text(
            "WITH handed AS (SELECT min(created_at) AS first, max(created_at) AS last FROM notifications"
            " WHERE event_id LIKE 'lat-%')"
            " SELECT handed.first, handed.last, count(a.accepted_at),"
            " count(a.accepted_at) FILTER (WHERE a.accepted_at BETWEEN handed.first AND handed.last)"
            " FROM handed, notifications n JOIN attempts a ON a.notification_id = n.id AND a.number = 1"
            " WHERE n.event_id LIKE 'lat-%' GROUP BY handed.first, handed.last")).one()
    span_s = (last - first).total_seconds() if during > 1 else 0.0
    messages = sandbox.messages_per_event()
    events = [f"lat-{i}" for i in range(pacing["handed_over"])]
    return {**pacing, **summary(latencies), "all_accepted": done, "cpu_ms_per_notification": cpu,
            "accepted": int(accepted), "sustained_per_s": round(during / span_s, 1) if span_s else None,
            "refused": len(refused), "refusals": sorted(set(refused)),
            "events_with_two_messages": sum(1 for event in events if messages.get(event, 0) > 1),
            "events_without_message": sum(1 for event in events if messages.get(event, 0) == 0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, required=True, help="notifications a second (half the measured warm sends/s)")
    parser.add_argument("--capacity", type=float, help="the measured warm sends/s the rate was derived from (reported)")
    parser.add_argument("--wait", type=float, default=300.0, help="seconds to wait for every notification's acceptance"
                        " after the hand-over (an overload run drains its backlog in this time)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each side is loaded")
    parser.add_argument("--contacts", type=int, default=200)
    parser.add_argument("--intake-threads", type=int, default=4, help="threads handing notifications over")
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    from tests.support.sandbox_process import running_sandbox

    with temp_database() as database_url, private_redis() as broker_url, running_sandbox(BENCH_SANDBOX) as sandbox, \
            tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        env = environment(api_url=sandbox.base_url, database_url=database_url, broker_url=broker_url)
        baseline = run_baseline(env, Path(tmp), args)
        ours = run_ours(env, Path(tmp), args, sandbox)
    emit({
        "benchmark": "intake-to-accepted latency at a steady rate",
        "rate_per_s": args.rate, "capacity_per_s": args.capacity, "seconds": args.seconds,
        "worker_concurrency": args.concurrency, "contacts": args.contacts,
        "baseline": baseline, "ours": ours,
        "ratio_p50": round(ours["p50_ms"] / baseline["p50_ms"], 2) if baseline["p50_ms"] else None,
        "ratio_p99": round(ours["p99_ms"] / baseline["p99_ms"], 2) if baseline["p99_ms"] else None,
    })
    whole = ours["all_accepted"] and not ours["refused"] and not ours["events_with_two_messages"] \
        and not ours["events_without_message"]
    return 0 if whole else 1


if __name__ == "__main__":
    raise SystemExit(main())
