"""Worker resident memory after 1,000 and after N sends (target: grows by less than 10%).

One real Celery worker (the settings of scripts/bench/send_path.py: prefork, ``--concurrency``
processes, Redis broker, PostgreSQL store) sends ``--sends`` warm-path notifications to the
sandbox. The notifications are written with SQL (rows and payloads exactly as intake writes
them, checked against ``intake.payload_of``) and their IDs published with the dispatcher's own
CeleryEnqueuer before the worker starts: intake at ~150 a second would add minutes and compete
for the same two cores. The resident set size (psutil) of the worker's main process and of each
pool process is sampled after 1,000 sends, at checkpoints, and at the end.

``--in-process`` measures instead this process's RSS around a loop calling
``dispatcher.sending.send.send_notification`` (the send path without Celery), for a quick run.

    .venv/bin/python scripts/bench/memory.py --sends 100000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401
from common import (
    BENCH_SANDBOX,
    PHONE_PREFIX,
    accepted_count,
    emit,
    environment,
    private_redis,
    reminder,
    settings_from,
    start_worker,
    stop,
    temp_database,
)

CONTENT_TAIL = ": your appointment is tomorrow at 09:00"

INSERT_NOTIFICATIONS = """
INSERT INTO notifications (event_id, fingerprint, route, fallback_route, state, enqueued_at, created_at, updated_at, channel)
SELECT 'mem-' || g, md5(g::text) || md5((g + 1)::text), 'reminders', 'sms', 'queued', now(), now(), now(), 'messaging_platform'
FROM generate_series(0, CAST(:count AS bigint) - 1) AS g
"""
INSERT_PAYLOADS = """
INSERT INTO payloads (notification_id, body)
SELECT id, json_build_object(
    'content', 'Reminder ' || event_id || :tail,
    'contact', json_build_object('identifier', 'bench-patient-' || (substr(event_id, 5)::bigint % :contacts),
                                 'name', 'Bench Patient',
                                 'phone_number', :prefix || lpad((substr(event_id, 5)::bigint % :contacts)::text, 4, '0')),
    'template', json_build_object('name', 'appointment_reminder', 'language', 'en', 'category', 'UTILITY',
                                  'params', json_build_object('1', 'Bench Patient', '2', 'tomorrow 09:00')),
    'metadata', json_build_object())
FROM notifications WHERE event_id LIKE 'mem-%'
"""


def write_rows(engine: Any, count: int, contacts: int) -> list[int]:
    import sqlalchemy as sa

    from dispatcher.intake.accept import payload_of
    from dispatcher.intake.request import parse_request

    params = {"tail": CONTENT_TAIL, "contacts": contacts, "prefix": PHONE_PREFIX}
    with engine.begin() as connection:
        connection.execute(sa.text(INSERT_NOTIFICATIONS), {"count": count})
        connection.execute(sa.text(INSERT_PAYLOADS), params)
        sample = connection.execute(sa.text(
            "SELECT p.body FROM payloads p JOIN notifications n ON n.id = p.notification_id WHERE n.event_id = 'mem-7'")).scalar_one()
        ids = list(connection.execute(sa.text("SELECT id FROM notifications WHERE event_id LIKE 'mem-%' ORDER BY id")).scalars())
    expected = payload_of(parse_request(reminder("mem-7", 7 % contacts)))
    if json.loads(json.dumps(sample)) != json.loads(json.dumps(expected)):
        raise SystemExit(f"the SQL-written payload differs from intake's:\n{sample}\n{expected}")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(sa.text("VACUUM ANALYZE"))
    return ids


def rss_of_tree(pid: int) -> dict[str, Any]:
    import psutil

    main = psutil.Process(pid)
    children = main.children(recursive=True)
    pool = sorted((c.memory_info().rss for c in children), reverse=True)
    main_rss = main.memory_info().rss
    return {"main_mib": round(main_rss / 2**20, 2), "pool_mib": [round(r / 2**20, 2) for r in pool],
            "total_mib": round((main_rss + sum(pool)) / 2**20, 2)}


def warm(settings: Any, dispatcher: Any, contacts: int) -> None:
    from tests.support.dispatcher_setup import drive, send_context

    with send_context(settings) as context:
        for contact in range(contacts):
            dispatcher.notify(reminder(f"warm-{contact}", contact))
            drive(context, dispatcher.enqueuer.sent[-1])


def checkpoints(sends: int, first: int) -> list[int]:
    step = max(sends // 20, 1)
    points = sorted({first, *range(step, sends, step), sends})
    return [p for p in points if p >= first]


def run_workers(env: dict[str, str], engine: Any, ids: list[int], args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from dispatcher.enqueue import CeleryEnqueuer

    started = time.perf_counter()
    enqueuer = CeleryEnqueuer(env["DISPATCHER_BROKER_URL"])
    published = len(enqueuer.enqueue_send(ids))
    enqueuer.close()
    publish_s = time.perf_counter() - started
    worker = start_worker(env, workdir / "worker.log", concurrency=args.concurrency)
    samples: list[dict[str, Any]] = []
    began = time.perf_counter()
    try:
        for point in checkpoints(len(ids), args.first):
            while True:
                done = accepted_count(engine, "mem-")
                if done >= point:
                    break
                if worker.poll() is not None:
                    raise SystemExit(f"the worker exited; see {workdir / 'worker.log'}")
                if time.perf_counter() - began > args.max_seconds:
                    break
                time.sleep(0.2 if point <= args.first else 1.0)
            samples.append({"sends": done, "seconds": round(time.perf_counter() - began, 1), **rss_of_tree(worker.pid)})
            print(f"memory: {done} sends, {samples[-1]['total_mib']} MiB", flush=True, file=__import__("sys").stderr)
            if time.perf_counter() - began > args.max_seconds:
                break
    finally:
        stop(worker)
    return {"mode": "real worker", "published": published, "publish_seconds": round(publish_s, 1), "samples": samples}


def run_in_process(settings: Any, ids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    import psutil

    from dispatcher.sending.send import send_notification
    from tests.support.dispatcher_setup import send_context

    me = psutil.Process()
    samples = []
    points = iter(checkpoints(len(ids), args.first))
    point = next(points)
    began = time.perf_counter()
    with send_context(settings) as context:
        for number, notification_id in enumerate(ids, start=1):
            send_notification(notification_id, context)
            if number == point:
                samples.append({"sends": number, "seconds": round(time.perf_counter() - began, 1),
                                "main_mib": round(me.memory_info().rss / 2**20, 2), "pool_mib": [],
                                "total_mib": round(me.memory_info().rss / 2**20, 2)})
                point = next(points, -1)
            if time.perf_counter() - began > args.max_seconds:
                break
    return {"mode": "in-process loop", "samples": samples}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sends", type=int, default=100_000)
    parser.add_argument("--first", type=int, default=1000, help="the reference point (sends)")
    parser.add_argument("--contacts", type=int, default=200, help="known contacts (each conversation stays under 200 a minute)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--in-process", action="store_true", help="measure this process around a send_notification loop")
    parser.add_argument("--max-seconds", type=float, default=1800.0, help="stop sampling after this long")
    args = parser.parse_args()

    from dispatcher.enqueue import ListEnqueuer
    from dispatcher.service import Dispatcher
    from dispatcher.store.migrate import upgrade_database
    from tests.support.sandbox_process import running_sandbox

    with temp_database() as database_url, private_redis() as broker_url, running_sandbox(BENCH_SANDBOX) as sandbox, \
            tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        upgrade_database(database_url)
        env = environment(api_url=sandbox.base_url, database_url=database_url, broker_url=broker_url)
        settings = settings_from(env)
        dispatcher = Dispatcher(settings, enqueuer=ListEnqueuer())
        engine = dispatcher.sessions.kw["bind"]
        warm(settings, dispatcher, args.contacts)
        ids = write_rows(engine, args.sends, args.contacts)
        if args.in_process:
            run = run_in_process(settings, ids, args)
        else:
            run = run_workers(env, engine, ids, args, Path(tmp))
        accepted = accepted_count(engine, "mem-")
    samples = run["samples"]
    first, last = samples[0], samples[-1]
    growth = round(last["total_mib"] / first["total_mib"] - 1, 4)
    pool_growth = None
    if first["pool_mib"] and last["pool_mib"]:
        pool_growth = round(max(last["pool_mib"]) / max(first["pool_mib"]) - 1, 4)
    emit({
        "benchmark": "worker resident memory by sends",
        **{k: v for k, v in run.items() if k != "samples"},
        "sends_requested": args.sends, "sends_done": last["sends"], "accepted": accepted,
        "worker_concurrency": args.concurrency, "contacts": args.contacts,
        "rss_first": first, "rss_last": last,
        "growth": growth, "largest_pool_process_growth": pool_growth,
        "rate_per_s": round((last["sends"] - first["sends"]) / max(last["seconds"] - first["seconds"], 1e-9), 1),
        "target_growth_max": 0.10, "met": growth < 0.10,
        "samples": samples,
    })
    return 0 if last["sends"] >= args.sends else 1


if __name__ == "__main__":
    raise SystemExit(main())
