"""The outbox relay: rows a second that the beat sweep publishes, beside the publishes alone.

    .venv/bin/python scripts/bench/relay.py --rows 10000

Stages ROWS notifications with ``dispatcher.intake.outbox.add`` in one transaction of a fresh
PostgreSQL database (as a host would), then times, against a Redis broker of its own (a
redis-server on a free port, stopped at the end; nothing else is touched):

- baseline: ``CeleryEnqueuer.enqueue_send`` of ROWS notification IDs in batches of the sweep's
  size: the publish alone, no database;
- ours: ``dispatcher.operations.sweep.sweep`` with the same kind of enqueuer, called until it
  publishes nothing more (each call runs batches for up to its default budget, as beat's would);
- two sweeps at once, in two processes: rows a second together, and how many rows both published
  (the relay promises none);
- one task per waiting row (issue 44): the ROWS relayed wait in the queue, nothing consuming, while
  the sweep runs every ``sweep_interval_s`` of a moved clock through ``--periods`` stale periods
  (``stale_after_s`` at its default): the peak of send tasks in the queue ÷ the backlog, for the
  sweep as it is and as it was (judging by age alone: a broker whose depth it cannot read); then
  Redis is killed and started empty, and the same sweeps publish each lost row once more.

Prints one JSON object. Target (issue 14): at least 2,000 rows a second.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from common import REPO, temp_database  # type: ignore[import-not-found]

sys.path.insert(0, str(REPO))

import redis as redis_client  # noqa: E402

from dispatcher.enqueue import CeleryEnqueuer  # noqa: E402
from dispatcher.intake import outbox  # noqa: E402
from dispatcher.operations.sweep import BATCH, sweep  # noqa: E402
from dispatcher.queues import SEND_QUEUE  # noqa: E402
from dispatcher.settings import Settings  # noqa: E402
from dispatcher.store.db import session_factory, shared_engine  # noqa: E402
from dispatcher.store.migrate import upgrade_database  # noqa: E402
from tests.support.dispatcher_setup import example_settings, reminder  # noqa: E402
from tests.support.redis_server import PrivateRedis  # noqa: E402


class Counting(CeleryEnqueuer):
    def __init__(self, broker_url: str) -> None:
        super().__init__(broker_url)
        self.ids: list[int] = []

    def enqueue_send(self, notification_ids, *, queue=SEND_QUEUE):  # type: ignore[no-untyped-def]
        published = super().enqueue_send(notification_ids, queue=queue)
        self.ids.extend(published)
        return published


def stage(database_url: str, rows: int, prefix: str) -> float:
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=database_url)
    sessions = session_factory(shared_engine(database_url))
    started = time.perf_counter()
    with sessions.begin() as session:
        for number in range(rows):
            outbox.add(session, reminder(f"{prefix}-{number}", identifier=f"patient-{number % 500}",
                                         phone=f"+1555033{number % 500:04d}"), settings=settings)
    return time.perf_counter() - started


STALE_AFTER_S = Settings.model_fields["stale_after_s"].default  # the defaults: 45 s and 5 s
SWEEP_INTERVAL_S = Settings.model_fields["sweep_interval_s"].default


class AgeOnly(Counting):
    """The sweep as it was before issue 44: it cannot read the queue's depth, so it judges by age alone."""

    def send_queue_depth(self) -> int | None:
        return None


def held_backlog(database_url: str, broker_url: str, kind: type[Counting], start: datetime, periods: int,
                 backlog: int) -> dict[str, Any]:
    """Sweeps every beat interval of a moved clock for ``periods`` stale periods, nothing consuming:
    the peak of send tasks in the queue ÷ the backlog, and how many tasks the sweeps published."""
    sessions = session_factory(shared_engine(database_url))
    enqueuer = kind(broker_url)
    peak = CeleryEnqueuer.send_queue_depth(enqueuer) or 0
    for step in range(1, int(periods * STALE_AFTER_S / SWEEP_INTERVAL_S) + 1):
        moment = start + timedelta(seconds=step * SWEEP_INTERVAL_S)
        sweep(sessions=sessions, enqueuer=enqueuer, stale_after_s=STALE_AFTER_S, clock=lambda moment=moment: moment)
        peak = max(peak, CeleryEnqueuer.send_queue_depth(enqueuer) or 0)
    enqueuer.close()
    return {"peak_queue": peak, "peak_queue_per_backlog": round(peak / backlog, 2), "published": len(enqueuer.ids)}


def relay_all(database_url: str, broker_url: str, result: multiprocessing.Queue[list[int]] | None = None,
              ready: Any = None) -> list[int]:
    sessions = session_factory(shared_engine(database_url))
    enqueuer = Counting(broker_url)
    if ready is not None:
        ready.wait()  # the processes start together, once imported and connected: the clock starts then
    while sweep(sessions=sessions, enqueuer=enqueuer, stale_after_s=300):
        pass
    enqueuer.close()
    if result is not None:
        result.put(enqueuer.ids)
    return enqueuer.ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--periods", type=int, default=4, help="stale periods the held backlog is swept through")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as folder, temp_database() as database_url:
        upgrade_database(database_url)
        redis = PrivateRedis(Path(folder))
        redis.start()
        try:
            broker_url = redis.url
            # baseline: the publishes alone
            publisher = Counting(broker_url)
            ids = list(range(1, args.rows + 1))
            started = time.perf_counter()
            for offset in range(0, len(ids), BATCH):
                publisher.enqueue_send(ids[offset:offset + BATCH])
            publish_s = time.perf_counter() - started
            publisher.close()

            redis_client.from_url(broker_url).flushdb()  # the baseline's tasks: this benchmark's own server

            staging_s = stage(database_url, args.rows, "one")
            started = time.perf_counter()
            relayed = relay_all(database_url, broker_url)
            relay_s = time.perf_counter() - started
            assert sorted(relayed) == sorted(set(relayed)) and len(relayed) == args.rows, "the relay lost or repeated rows"

            # one task per waiting row: the relayed rows wait in the queue, no worker takes any
            now = datetime.now(UTC)
            held = held_backlog(database_url, broker_url, Counting, now, args.periods, args.rows)
            redis.kill()  # started again empty: every queued task lost
            redis.start()
            after_restart = held_backlog(database_url, broker_url, Counting, now + timedelta(hours=1), args.periods,
                                         args.rows)
            age_only = held_backlog(database_url, broker_url, AgeOnly, now + timedelta(hours=2), args.periods,
                                    args.rows)
            redis_client.from_url(broker_url).flushdb()  # (those rows' marks lie hours ahead: the next stage's sweeps leave them)

            stage(database_url, args.rows, "two")
            context = multiprocessing.get_context("spawn")
            queue: multiprocessing.Queue[list[int]] = context.Queue()
            ready = context.Barrier(3)
            processes = [context.Process(target=relay_all, args=(database_url, broker_url, queue, ready))
                         for _ in range(2)]
            for process in processes:
                process.start()
            ready.wait()
            started = time.perf_counter()
            published = [queue.get(timeout=600) for _ in processes]
            two_s = time.perf_counter() - started
            for process in processes:
                process.join()
            together = [notification_id for ids_of_one in published for notification_id in ids_of_one]
        finally:
            redis.stop()
    print(json.dumps({
        "rows": args.rows,
        "staging_rows_per_s": round(args.rows / staging_s, 1),
        "publish_alone_per_s": round(args.rows / publish_s, 1),
        "relay_rows_per_s": round(args.rows / relay_s, 1),
        "ratio": round(publish_s / relay_s, 3),
        "two_sweeps_rows_per_s": round(args.rows / two_s, 1),
        "two_sweeps_published": [len(ids_of_one) for ids_of_one in published],
        "two_sweeps_published_twice": len(together) - len(set(together)),
        "two_sweeps_missing": args.rows - len(set(together)),
        "target_rows_per_s": 2000,
        "held_backlog": {"periods": args.periods, "backlog": args.rows, "sweep": held, "after_broker_restart": after_restart,
                         "age_only_as_before": age_only},
    }, indent=2))


if __name__ == "__main__":
    main()
