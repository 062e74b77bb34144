"""Warm-path sends a second (known contacts) against a no-op Celery task, in the same run.

Both runs use the same broker (a Redis server of the benchmark's own), the same worker settings (the dispatcher's Celery app,
prefork, the same concurrency) and the same measurement: the queue is filled while no worker
runs, then one starts, and the rate is tasks over the time from the first task's start to the
last task's end. The dispatcher run also reads and writes PostgreSQL and calls the sandbox over
loopback. Intake (notify: validate, store, publish) is measured apart, from one host process.

    .venv/bin/python scripts/bench/send_path.py --notifications 1000 --concurrency 2

Prints JSON with both rates and their ratio (target: at least 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from common import add_broker_argument, cpu_seconds, measure_noop_rate, worker_stack  # noqa: E402  (scripts/bench/common.py, beside this script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notifications", type=int, default=1000)
    parser.add_argument("--contacts", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=2)
    add_broker_argument(parser)
    args = parser.parse_args()
    with worker_stack(args.broker) as (env, workdir):
        noop_rate = measure_noop_rate(env, workdir / "noop.log", tasks=args.notifications, concurrency=args.concurrency,
                                      queue="dispatcher.send")
        send_rate, intake_rate = _send_rate(env, workdir, args)
    print(json.dumps({
        "benchmark": "send_path (warm: known contacts)",
        "notifications": args.notifications,
        "worker_concurrency": args.concurrency,
        "broker": args.broker,
        "noop_tasks_per_s": round(noop_rate, 1),
        "sends_per_s": round(send_rate, 1),
        "ratio": round(send_rate / noop_rate, 3),
        "intake_notify_per_s_one_process": round(intake_rate, 1),
        "cpu_ms_per_send": CPU_MS_PER_SEND,
        "cpu_ms_per_send_other_processes": OTHER_MS_PER_SEND[0] if OTHER_MS_PER_SEND else None,
        "target_ratio": 0.5,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }, indent=2))


def _worker(env: dict[str, str], app: str, log: Path, concurrency: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", app, "worker", "--queues", "dispatcher.send",
         "--concurrency", str(concurrency), "--loglevel", "WARNING", "--without-gossip", "--without-mingle"],
        cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


def _send_rate(env: dict[str, str], workdir: Path, args: argparse.Namespace) -> tuple[float, float]:
    """Warm-path sends a second by the workers, and notify() calls a second by one host process."""
    os.environ.update(env)
    from dispatcher.service import Dispatcher
    from dispatcher.settings import load_settings
    from dispatcher.store.migrate import upgrade_database

    upgrade_database(env["DISPATCHER_DATABASE_URL"])
    dispatcher = Dispatcher(load_settings())
    engine = sa.create_engine(env["DISPATCHER_DATABASE_URL"])

    def accepted(prefix: str) -> int:
        with engine.connect() as connection:
            return int(connection.execute(
                sa.text("SELECT count(*) FROM notifications WHERE message_id IS NOT NULL AND event_id LIKE :p"),
                {"p": f"{prefix}%"},
            ).scalar_one())

    worker = _worker(env, "workers.app", workdir / "warm.log", args.concurrency)
    try:  # warm up: every contact known, with its source_id and conversation stored
        for contact in range(args.contacts):
            dispatcher.notify(_request(f"warm-{contact}", contact))
        _wait(lambda: accepted("warm-") >= args.contacts, 300)
    finally:
        _stop(worker)
    started = time.perf_counter()
    for number in range(args.notifications):
        dispatcher.notify(_request(f"bench-{number}", number % args.contacts))
    intake_rate = args.notifications / (time.perf_counter() - started)
    before = cpu_seconds([])
    worker = _worker(env, "workers.app", workdir / "send.log", args.concurrency)
    try:
        _wait(lambda: accepted("bench-") >= args.notifications, 900)
        after = cpu_seconds([worker.pid])
    finally:
        _stop(worker)
    for totals in (before, after):
        totals.pop("this_process")  # intake ran before this window: only the workers' share counts
    machine_ms = (after.pop("machine") - before.pop("machine")) * 1000 / args.notifications
    CPU_MS_PER_SEND.update({name: round((after[name] - before.get(name, 0.0)) * 1000 / args.notifications, 2) for name in after})
    OTHER_MS_PER_SEND.append(round(machine_ms - sum(CPU_MS_PER_SEND.values()), 2))
    with engine.connect() as connection:
        first, last = connection.execute(sa.text(
            "SELECT min(a.created_at), max(a.accepted_at) FROM attempts a"
            " JOIN notifications n ON n.id = a.notification_id WHERE n.event_id LIKE 'bench-%'"
        )).one()
    engine.dispose()
    return args.notifications / (last - first).total_seconds(), intake_rate


CPU_MS_PER_SEND: dict[str, float] = {}
OTHER_MS_PER_SEND: list[float] = []  # the rest of the machine's busy time meanwhile (other processes)


def _request(event_id: str, contact: int) -> dict[str, object]:
    return {
        "event_id": event_id,
        "route": "reminders",
        "contact": {"identifier": f"bench-patient-{contact}", "phone_number": f"+1555032{contact:04d}"},
        "content": f"Reminder {event_id}",
        "template": {"name": "appointment_reminder", "language": "en", "category": "UTILITY",
                     "params": {"1": "Patient", "2": "tomorrow"}},
    }


def _wait(condition: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise SystemExit(f"benchmark timed out after {timeout_s} s")


if __name__ == "__main__":
    main()
