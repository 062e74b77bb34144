"""CPU per notification, end to end and by component, against a no-op Celery task in the same run.

One notification's whole life on this machine, every part a real process: this process hands it
over with ``notify()`` (intake); a send worker sends it to the sandbox (stock profile, its own
timers: delivered after 0.5 s, read 1.5 s later); the sandbox posts its signed ``message_created``
and ``message_updated`` webhooks to the receiver (``python -m dispatcher receiver``), which
records and queues them; an outcome consumer applies them (stock events carry no status, so the
consumer reads the conversation's message list). The run waits until every notification is
``read`` and every delivery processed, then reads each process's CPU time (psutil) before and
after the notifications were handed over: intake, send worker, receiver, consumer, PostgreSQL,
the broker (the run's own Redis), and the sandbox (the workspace's side, not the dispatcher's).

The baseline, in the same run: a no-op Celery task (scripts/bench/noop_app.py) published from this
process to the same broker and run by one worker of the same concurrency; CPU of the publisher,
the worker and the broker per task.

    PYTHONPATH=scripts/bench .venv/bin/python scripts/bench/end_to_end.py --notifications 1200 --rate 40

Prints JSON: CPU ms per notification by component, the dispatcher's total (target: at most 8 ms),
the no-op task's CPU per task, how each notification ended, and the status reads' share of the
shared limiter's grants from the first hand-over until every notification was read
(``limiter_grants``: grants by bucket; ``reads_share`` = ``reads`` / ``account``). The limits are
lifted as in every benchmark (scripts/bench/common.py), so the share is what the reads take
unhindered; ``--api-requests-per-minute`` keeps a real budget instead, and the reads are then
held to ``reads_fraction_of_api_requests`` of it (0.2 by default; docs/tracking.md). Beat runs then
too, and the send worker serves the maintenance queue: a limiter wait longer than
``retry_max_countdown_s`` becomes a due time that only the sweep publishes (the tracking sweep's
read-backs are status reads as well).

    PYTHONPATH=scripts/bench .venv/bin/python scripts/bench/end_to_end.py --notifications 600 --rate 10 \
        --contacts 50 --api-requests-per-minute 600
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
import sqlalchemy as sa  # noqa: E402
from common import (
    BENCH_SANDBOX,
    REPO,
    LimiterGrants,
    emit,
    environment,
    private_redis,
    reminder,
    settings_from,
    start_beat,
    start_worker,
    stop,
    temp_database,
    wait_until,
)
from latency import paced  # the same pacing as figure 5's hand-over

TARGET_MS = 8.0
# The dispatcher's own parts; the sandbox stands for the workspace and `other` for the rest of the machine.
DISPATCHER_PARTS = ("intake", "send_worker", "receiver", "consumer", "postgresql", "broker")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its living children."""
    import psutil

    total = 0.0
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                total += times.user + times.system
    return total


def shared_processes(database_url: str, broker_url: str) -> dict[str, Any]:
    """Which processes count as PostgreSQL (the server's own processes and the backends of this
    run's database, not other databases' clients: the machine is shared), the broker (this run's
    Redis, by its port) and the sandbox."""
    from urllib.parse import urlsplit

    database = sa.engine.make_url(database_url).database or ""
    # redis-server names itself "redis-server 127.0.0.1:<port>" (padded), whatever its arguments were
    redis_address = re.compile(rf":{urlsplit(broker_url).port}\b")

    def postgresql(name: str, command: str) -> bool:
        if not name.startswith("postgres"):
            return False
        client = "(" in command or "[local]" in command  # a client backend: "... db 127.0.0.1(port) idle"
        return database in command or not client

    return {"postgresql": postgresql,
            "broker": lambda name, command: name.startswith("redis-server") and redis_address.search(command) is not None,
            "sandbox": lambda name, command: "-m sandbox" in command}


def snapshot(trees: dict[str, int], shared: dict[str, Any]) -> dict[str, float]:
    """CPU seconds so far by component: the named process trees, this process (intake), the shared
    processes (``shared_processes``) and the whole machine."""
    import psutil

    me = psutil.Process().cpu_times()
    taken = {"intake": me.user + me.system, **{name: 0.0 for name in shared}}
    for process in psutil.process_iter(["name", "cmdline", "cpu_times"]):
        times = process.info["cpu_times"]
        if times is None:
            continue
        name, command = process.info["name"] or "", " ".join(process.info["cmdline"] or [])
        for part, matches in shared.items():
            if matches(name, command):
                taken[part] += times.user + times.system
                break
    for name, pid in trees.items():
        taken[name] = tree_cpu_s(pid)
    system = psutil.cpu_times()
    taken["machine"] = system.user + system.system + sum(getattr(system, n, 0.0) for n in ("nice", "irq", "softirq"))
    return taken


def per_item_ms(before: dict[str, float], after: dict[str, float], items: int) -> dict[str, float]:
    used = {name: (after[name] - before[name]) * 1000 / max(items, 1) for name in after}
    used["other"] = used.pop("machine") - sum(used.values())
    return {name: round(value, 2) for name, value in used.items()}


def start_receiver(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "dispatcher", "receiver", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=1, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


def counts(engine: sa.Engine, prefix: str) -> dict[str, int]:
    """Notifications by state, and webhook deliveries not processed yet."""
    with engine.connect() as connection:
        states = {str(state): int(count) for state, count in connection.execute(sa.text(
            "SELECT state, count(*) FROM notifications WHERE event_id LIKE :p GROUP BY state"), {"p": f"{prefix}%"})}
        unprocessed = int(connection.execute(sa.text(
            "SELECT count(*) FROM webhook_deliveries WHERE processed_at IS NULL")).scalar_one())
    return {**states, "unprocessed_deliveries": unprocessed}


def run_baseline(env: dict[str, str], shared: dict[str, Any], workdir: Path, tasks: int, concurrency: int) -> dict[str, Any]:
    """CPU per no-op task: this process publishing, one worker running them, the broker."""
    import redis
    from celery import Celery

    from dispatcher.queues import SEND_QUEUE

    env = {**env, "BENCH_COUNTER_URL": env["DISPATCHER_BROKER_URL"],
           "PYTHONPATH": f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"}
    counter = redis.Redis.from_url(env["BENCH_COUNTER_URL"])
    counter.delete("bench:noop:done", "bench:noop:first", "bench:noop:last")
    producer = Celery("bench", broker=env["DISPATCHER_BROKER_URL"], set_as_current=False)
    worker = start_worker(env, workdir / "noop.log", concurrency=concurrency, app="scripts.bench.noop_app", name="noop")
    try:
        producer.send_task("bench.noop", args=[0], queue=SEND_QUEUE)
        if not wait_until(lambda: int(counter.get("bench:noop:done") or 0) >= 1, timeout_s=60, what="the no-op worker"):
            raise SystemExit("the no-op worker did not start")
        trees = {"worker": worker.pid}
        before = snapshot(trees, shared)
        for number in range(tasks):
            producer.send_task("bench.noop", args=[number], queue=SEND_QUEUE)
        if not wait_until(lambda: int(counter.get("bench:noop:done") or 0) >= tasks + 1, timeout_s=300,
                          what="the no-op tasks"):
            raise SystemExit("the no-op tasks did not finish")
        cpu = per_item_ms(before, snapshot(trees, shared), tasks)
    finally:
        stop(worker)
        producer.close()
    cpu = {"publisher": cpu.pop("intake"), **cpu}
    cpu.pop("postgresql")
    cpu.pop("sandbox")
    return {"tasks": tasks, "cpu_ms_per_task": cpu,
            "total_ms": round(cpu["publisher"] + cpu["worker"] + cpu["broker"], 2)}


def run_ours(env: dict[str, str], shared: dict[str, Any], sandbox: Any, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from dispatcher.api.client import WorkspaceClient
    from dispatcher.enqueue import CeleryEnqueuer
    from dispatcher.service import Dispatcher
    from dispatcher.store.migrate import upgrade_database
    from tests.support.sandbox_process import free_port

    upgrade_database(env["DISPATCHER_DATABASE_URL"])
    settings = settings_from(env)
    port = free_port()
    with WorkspaceClient.from_settings(settings) as client:
        webhook = client.create_webhook(url=f"http://127.0.0.1:{port}{settings.webhook_path}",
                                        subscriptions=["message_created", "message_updated"])
    assert webhook.secret is not None
    env = {**env, "DISPATCHER_WEBHOOK_SECRETS": webhook.secret.get_secret_value()}
    enqueuer = CeleryEnqueuer(env["DISPATCHER_BROKER_URL"])
    dispatcher = Dispatcher(settings_from(env), enqueuer=enqueuer)
    engine = dispatcher.sessions.kw["bind"]
    # With a real budget a limiter wait can outlast retry_max_countdown_s and become a due time,
    # which only the sweep publishes: beat runs then (and with it the read-backs, reads too).
    budgeted = args.api_requests_per_minute is not None
    processes = {
        "send_worker": start_worker(env, workdir / "send.log", concurrency=args.concurrency, name="send",
                                    queues="dispatcher.send,dispatcher.maintenance" if budgeted else "dispatcher.send"),
        "consumer": start_worker(env, workdir / "consumer.log", concurrency=args.concurrency,
                                 queues="dispatcher.outcomes", name="consumer"),
        "receiver": start_receiver(env, port, workdir / "receiver.log"),
    }
    beat = start_beat(env, workdir / "beat.log", workdir / "beat-schedule") if budgeted else None
    try:
        if not wait_until(lambda: answers(f"http://127.0.0.1:{port}/healthz"), timeout_s=30, what="the receiver"):
            raise SystemExit(f"the receiver did not start; see {workdir / 'receiver.log'}")

        def settled(prefix: str, total: int) -> bool:
            now = counts(engine, prefix)
            return now.get("read", 0) + now.get("failed", 0) >= total and now["unprocessed_deliveries"] == 0

        for contact in range(args.contacts):  # warm: contacts, source_ids and conversations known
            dispatcher.notify(reminder(f"warm-{contact}", contact))
        wait_until(lambda: settled("warm-", args.contacts), timeout_s=300, what="the warm-up", interval_s=0.5)
        time.sleep(2)  # the warm-up's last webhooks and tasks
        trees = {name: process.pid for name, process in processes.items()}
        before = snapshot(trees, shared)
        with LimiterGrants(env.get("DISPATCHER_REDIS_URL") or env["DISPATCHER_BROKER_URL"]) as grants:
            seconds = paced(args.rate, args.notifications / args.rate,
                            lambda i: dispatcher.notify(reminder(f"e2e-{i}", i % args.contacts)),
                            threads=args.intake_threads)["seconds"]
            began_wait = time.monotonic()
            done = wait_until(lambda: settled("e2e-", args.notifications), timeout_s=600,
                              what="every notification read", interval_s=0.5)
            settle_tail_s = time.monotonic() - began_wait
            cpu = per_item_ms(before, snapshot(trees, shared), args.notifications)
        final = counts(engine, "e2e-")
        messages = sandbox.messages_per_event()
    finally:
        for process in [*processes.values(), beat]:
            stop(process)
        enqueuer.close()
    ours_total = round(sum(cpu[name] for name in DISPATCHER_PARTS), 2)
    return {"handed_over": args.notifications, "handover_seconds": round(seconds, 1),
            "achieved_rate": round(args.notifications / seconds, 1), "settled": done,
            "seconds_to_settle_after_handover": round(settle_tail_s, 1), "states": final,
            "events_with_two_messages": sum(1 for event, n in messages.items() if event.startswith("e2e-") and n > 1),
            "events_without_message": sum(1 for i in range(args.notifications) if messages.get(f"e2e-{i}", 0) == 0),
            "cpu_ms_per_notification": cpu, "dispatcher_ms_per_notification": ours_total,
            "limiter_grants": {**grants.summary(), "api_requests_per_minute": settings.api_requests_per_minute,
                               "reads_fraction_of_api_requests": settings.reads_fraction_of_api_requests}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notifications", type=int, default=1200)
    parser.add_argument("--rate", type=float, default=40.0, help="notifications a second handed over (below capacity)")
    parser.add_argument("--contacts", type=int, default=100)
    parser.add_argument("--intake-threads", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes of the send worker and of the consumer")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs in this folder (default: a temporary one)")
    parser.add_argument("--api-requests-per-minute", type=int,
                        help="a real budget for the workers' limiter (default: lifted, as in every benchmark)")
    args = parser.parse_args()
    from tests.support.sandbox_process import running_sandbox

    with temp_database() as database_url, private_redis() as broker_url, running_sandbox(BENCH_SANDBOX) as sandbox, \
            tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            tmp = str(args.logs)
        budget = {} if args.api_requests_per_minute is None else {
            "DISPATCHER_API_REQUESTS_PER_MINUTE": str(args.api_requests_per_minute)}
        env = environment(api_url=sandbox.base_url, database_url=database_url, broker_url=broker_url, **budget)
        shared = shared_processes(database_url, broker_url)
        baseline = run_baseline(env, shared, Path(tmp), args.notifications, args.concurrency)
        ours = run_ours(env, shared, sandbox, Path(tmp), args)
    whole = ours["settled"] and ours["events_with_two_messages"] == 0 and ours["events_without_message"] == 0
    emit({
        "benchmark": "CPU per notification end to end, by component",
        "notifications": args.notifications, "rate_per_s": args.rate, "concurrency": args.concurrency,
        "contacts": args.contacts, "api_requests_per_minute": args.api_requests_per_minute,
        "baseline": baseline, "ours": ours, "target_ms": TARGET_MS,
        "met": ours["dispatcher_ms_per_notification"] <= TARGET_MS,
        "ratio_to_noop_task": round(ours["dispatcher_ms_per_notification"] / baseline["total_ms"], 1)
        if baseline["total_ms"] else None,
    })
    return 0 if whole else 1


if __name__ == "__main__":
    raise SystemExit(main())
