"""Applied outcomes a second by the outcome consumer, against a no-op task on the same queue, in one run.

Both runs use the same broker (a Redis server of the benchmark's own), the dispatcher's Celery app
and settings, and the same worker concurrency. The notifications are first sent for real (warm
path, against the sandbox); then one verified ``message_updated`` ``delivered`` delivery per message
is recorded as the receiver records it (``record_deliveries``) and published with the receiver's
own publisher while no consumer runs, in groups of ``--group`` (the receiver publishes each group
commit's rows as one task, applied together); then one consumer starts. The rate is deliveries over the
time from the first one's processing to the last one's; the no-op's is measured the same way.
Deliveries carry their status, as the contract's do (a stock workspace's carry none, and each
then costs a read of the message list: that is the API's cost, not the consumer's).

    PYTHONPATH=scripts/bench .venv/bin/python scripts/bench/consumer.py --outcomes 1000 --concurrency 2

Prints JSON with both rates, their ratio (target: at least 0.5), and SQL statements per outcome.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine.interfaces import CacheStats

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from common import (  # noqa: E402  (scripts/bench/common.py, beside this script)
    add_broker_argument,
    measure_noop_rate,
    reminder,
    start_worker,
    stop,
    wait_until,
    worker_stack,
)

OUTCOMES_QUEUE = "dispatcher.outcomes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outcomes", type=int, default=1000)
    parser.add_argument("--contacts", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--group", type=int, default=16,
                        help="deliveries per consumer task, as the receiver's group commit publishes them (1: one task"
                             " each, a receiver at low load; 16: the mean group of figure 4's 32 connections)")
    add_broker_argument(parser)
    parser.add_argument("--profile", action="store_true",
                        help="profile the in-process count (cProfile) and print where its time goes, by package")
    args = parser.parse_args()
    PROFILE.append(args.profile)
    with worker_stack(args.broker) as (env, workdir):
        noop_rate = measure_noop_rate(env, workdir / "noop.log", tasks=args.outcomes, concurrency=args.concurrency,
                                      queue=OUTCOMES_QUEUE)
        outcome_rate, statements = _outcome_rate(env, workdir, args)
    print(json.dumps({
        "benchmark": "outcome consumer (message_updated with a status)",
        "outcomes": args.outcomes,
        "worker_concurrency": args.concurrency,
        "deliveries_per_task": args.group,
        "broker": args.broker,
        "noop_tasks_per_s": round(noop_rate, 1),
        "outcomes_per_s": round(outcome_rate, 1),
        "ratio": round(outcome_rate / noop_rate, 3),
        "sql_statements_per_outcome": round(statements[0], 1),
        "commits_per_outcome": round(statements[1], 1),
        # statements SQLAlchemy compiled while applying them, after the first group warmed the process
        "compilations_per_outcome": round(statements[2], 3),
        "target_ratio": 0.5,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }, indent=2))


def _outcome_rate(env: dict[str, str], workdir: Path,
                  args: argparse.Namespace) -> tuple[float, tuple[float, float, float]]:
    os.environ.update(env)
    from dispatcher.service import Dispatcher
    from dispatcher.settings import load_settings
    from dispatcher.store.db import session_factory, shared_engine
    from dispatcher.store.migrate import upgrade_database
    from dispatcher.tracking.webhooks.deliveries import CeleryOutcomePublisher, NewDelivery, record_deliveries
    from dispatcher.tracking.webhooks.events import EventSummary

    upgrade_database(env["DISPATCHER_DATABASE_URL"])
    settings = load_settings()
    dispatcher = Dispatcher(settings)
    engine = sa.create_engine(env["DISPATCHER_DATABASE_URL"])
    for number in range(args.outcomes):
        dispatcher.notify(reminder(f"bench-{number}", number % args.contacts))
    sender = start_worker(env, workdir / "send.log", concurrency=args.concurrency)
    try:
        _wait(lambda: _count(engine, "SELECT count(*) FROM notifications WHERE message_id IS NOT NULL") >= args.outcomes,
              "the sends")
    finally:
        stop(sender)
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT message_id, conversation_id, inbox_id FROM notifications WHERE message_id IS NOT NULL")).all()
    now = datetime.now(UTC)
    deliveries = [NewDelivery(
        delivery_id=f"bench-{message_id}", event="message_updated", received_at=now,
        summary=EventSummary(event="message_updated", message_id=message_id, status="delivered",
                             message_type="outgoing", conversation_display_id=conversation_id, inbox_id=inbox_id,
                             account_id=settings.account_id).model_dump(mode="json"),
    ) for message_id, conversation_id, inbox_id in rows]
    row_ids = [row_id for row_id in record_deliveries(session_factory(shared_engine(settings.database_url)), deliveries)
               if row_id is not None]
    publisher = CeleryOutcomePublisher(settings.broker_url)
    for start in range(0, len(row_ids), args.group):  # as the receiver publishes each group commit's rows
        publisher.publish_many(row_ids[start:start + args.group])
    publisher.close()
    consumer = start_worker(env, workdir / "consume.log", concurrency=args.concurrency, queues=OUTCOMES_QUEUE)
    try:
        _wait(lambda: _count(engine, "SELECT count(*) FROM webhook_deliveries WHERE processed_at IS NOT NULL")
              >= len(row_ids), "the outcomes")
    finally:
        stop(consumer)
    statements = _statements_in_process(rows[:48], settings, group=args.group)
    with engine.connect() as connection:
        first, last, applied = connection.execute(sa.text(
            "SELECT min(processed_at), max(processed_at), count(*) FILTER (WHERE outcome = 'applied_delivered')"
            " FROM webhook_deliveries")).one()
    engine.dispose()
    if applied != len(row_ids):
        raise SystemExit(f"only {applied} of {len(row_ids)} deliveries were applied")
    return (len(row_ids) - 1) / (last - first).total_seconds(), statements


def _statements_in_process(rows: list[tuple[int, int, int]], settings: object, *,
                           group: int) -> tuple[float, float, float]:
    """Statements and transactions per applied outcome, counted by SQLAlchemy's events while this
    process applies ``read`` to each of ``rows`` as the consumer tasks do, ``group`` a task (same
    code, same store)."""
    from sqlalchemy import event

    from dispatcher.tracking.reconcile import process_deliveries, process_delivery
    from dispatcher.tracking.webhooks.deliveries import NewDelivery, record_deliveries
    from dispatcher.tracking.webhooks.events import EventSummary
    from workers import runtime

    ctx = runtime.send_context()
    now = datetime.now(UTC)
    row_ids = [row_id for row_id in record_deliveries(ctx.sessions, [NewDelivery(
        delivery_id=f"count-{message_id}", event="message_updated", received_at=now,
        summary=EventSummary(event="message_updated", message_id=message_id, status="read", message_type="outgoing",
                             conversation_display_id=conversation_id, inbox_id=inbox_id).model_dump(mode="json"),
    ) for message_id, conversation_id, inbox_id in rows]) if row_id is not None]
    engine = ctx.sessions.kw["bind"]
    counts = {"statements": 0, "transactions": 0, "compilations": 0}

    def statement(*_: object) -> None:
        counts["statements"] += 1

    def compiled(_conn: object, _cursor: object, _statement: str, _parameters: object, context: Any, _many: bool) -> None:
        if getattr(context, "compiled", None) is not None and context.cache_hit is not CacheStats.CACHE_HIT:
            counts["compilations"] += 1

    def transaction(*_: object) -> None:
        counts["transactions"] += 1

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "after_cursor_execute", compiled)
    event.listen(engine, "commit", transaction)
    profiler = cProfile.Profile() if PROFILE and PROFILE[0] else None
    try:
        if profiler is not None:
            profiler.enable()
        for start in range(0, len(row_ids), group):
            if start == group:  # the first group warmed the process: its compilations are not counted
                counts["compilations"] = 0
            chunk = row_ids[start:start + group]
            if len(chunk) == 1:  # the single task
                assert process_delivery(chunk[0], ctx, runtime.enqueuer()) == "applied_read"
            else:
                assert process_deliveries(chunk, ctx, runtime.enqueuer()).words == {"applied_read": len(chunk)}
    finally:
        if profiler is not None:
            profiler.disable()
            _print_by_package(profiler)
            if os.environ.get("BENCH_PROFILE_OUT"):  # the whole profile, for pstats
                profiler.dump_stats(os.environ["BENCH_PROFILE_OUT"])
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "after_cursor_execute", compiled)
        event.remove(engine, "commit", transaction)
    return (counts["statements"] / len(row_ids), counts["transactions"] / len(row_ids),
            counts["compilations"] / max(len(row_ids) - group, 1))


PROFILE: list[bool] = []


def _print_by_package(profiler: cProfile.Profile) -> None:
    """Own time by package (sqlalchemy, psycopg, pydantic, dispatcher, ...), to stderr."""
    totals: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, _) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        parts = Path(filename).parts
        package = next((part for part in ("sqlalchemy", "psycopg", "pydantic", "dispatcher", "kombu", "celery")
                        if part in parts), "other")
        totals[package] = totals.get(package, 0.0) + own
    whole = sum(totals.values()) or 1.0
    print({name: f"{100 * seconds / whole:.0f} %" for name, seconds in sorted(totals.items(), key=lambda i: -i[1])},
          file=sys.stderr)


def _count(engine: sa.Engine, query: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(query)).scalar_one())



def _wait(condition: Callable[[], bool], what: str) -> None:
    if not wait_until(condition, timeout_s=900, what=what):
        raise SystemExit(f"benchmark timed out waiting for {what}")


if __name__ == "__main__":
    main()
