"""Bulk hand-over: events a second accepted by ``notify_many``, beside ``notify`` one at a time.

    .venv/bin/python scripts/bench/intake_batch.py --single 1000 --events 10000

Both on the production store and broker, in one run: a fresh PostgreSQL database and a Redis of
the benchmark's own (a redis-server on a free port, stopped at the end; the database is dropped),
the example configuration. ``notify`` hands SINGLE events over one by one; ``notify_many`` hands
EVENTS over in batches of 1,000. Every event is checked stored and its send task published (the
Redis queue's length). Prints one JSON object. Target (issue 15): at least 2,000 events a second.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import redis
from common import REPO, temp_database  # type: ignore[import-not-found]

sys.path.insert(0, str(REPO))

from sqlalchemy import func, select  # noqa: E402

from dispatcher.enqueue import CeleryEnqueuer  # noqa: E402
from dispatcher.intake.batch import MAX_BATCH, ItemOutcome  # noqa: E402
from dispatcher.queues import SEND_QUEUE  # noqa: E402
from dispatcher.service import Dispatcher  # noqa: E402
from dispatcher.store.migrate import upgrade_database  # noqa: E402
from dispatcher.store.models import Notification  # noqa: E402
from tests.support.dispatcher_setup import example_settings, reminder  # noqa: E402
from tests.support.redis_server import PrivateRedis  # noqa: E402


def request(prefix: str, number: int) -> dict[str, object]:
    return reminder(f"{prefix}-{number}", identifier=f"bulk-patient-{number % 5000}", phone=f"+1555035{number % 5000:04d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", type=int, default=1_000, help="events handed over one by one")
    parser.add_argument("--events", type=int, default=10_000, help="events handed over in batches of 1,000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as folder, temp_database() as database_url:
        upgrade_database(database_url)
        broker = PrivateRedis(Path(folder))
        broker.start()
        try:
            settings = example_settings(api_url="http://127.0.0.1:9", database_url=database_url, broker_url=broker.url)
            enqueuer = CeleryEnqueuer(broker.url)
            dispatcher = Dispatcher(settings, enqueuer=enqueuer)
            dispatcher.notify_many([request("warm", n) for n in range(50)])  # connections, caches, imports
            dispatcher.notify(request("warm-one", 0))

            started = time.perf_counter()
            for number in range(args.single):
                dispatcher.notify(request("one", number))
            single_s = time.perf_counter() - started

            started = time.perf_counter()
            outcomes = []
            for offset in range(0, args.events, MAX_BATCH):
                batch = [request("many", n) for n in range(offset, min(offset + MAX_BATCH, args.events))]
                outcomes += [item.outcome for item in dispatcher.notify_many(batch)]
            batch_s = time.perf_counter() - started
            enqueuer.close()

            assert outcomes.count(ItemOutcome.ACCEPTED) == args.events, "a batch item was not accepted"
            with dispatcher.sessions() as session:
                stored = session.scalar(select(func.count()).select_from(Notification)
                                        .where(Notification.event_id.like("many-%")))
            published = redis.Redis.from_url(broker.url).llen(SEND_QUEUE)
            assert stored == args.events, f"{stored} of {args.events} batch events stored"
            assert published == 50 + 1 + args.single + args.events, f"{published} send tasks published"
        finally:
            broker.stop()
    print(json.dumps({
        "single_events": args.single,
        "batch_events": args.events,
        "batch_size": MAX_BATCH,
        "single_per_s": round(args.single / single_s, 1),
        "batch_per_s": round(args.events / batch_s, 1),
        "ratio": round((args.events / batch_s) / (args.single / single_s), 2),
        "target_per_s": 2000,
    }, indent=2))


if __name__ == "__main__":
    main()
