"""Duplicates and losses under the chaos suite's API faults: the hand-written baseline and ours.

The sandbox answers 5% of every operation's calls with 503, 2% with 429, and drops 1% of
createMessage responses after committing the message (the connection closes before any byte).
The same ``--events`` reminders (``--contacts`` contacts, several events each) go through:

* the baseline (scripts/bench/naive_client.py): the contract's steps for every notification,
  any error retries the whole sequence (``--naive-tries`` tries, 0.2 s apart), from
  ``--concurrency`` threads;
* the dispatcher: intake from this process, two real Celery workers (``--concurrency`` each)
  and beat, Redis broker, PostgreSQL store; the run ends when every notification has a message
  or a final failure, or after ``--max-seconds``.

Each side gets its own fresh sandbox with the same seed and faults. Counted from the sandbox's
own messages (the event ID is in the content): duplicates are events with more than one
message, losses events with none. Worker kills, Redis restarts and webhook faults belong to
the chaos suite (tests/chaos), not to this comparison.

    .venv/bin/python scripts/bench/faults.py --events 1000 --contacts 200
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common  # noqa: F401
import naive_client
from common import (
    BENCH_SANDBOX,
    emit,
    environment,
    event_of,
    private_redis,
    reminder,
    settings_from,
    settled_count,
    start_beat,
    start_worker,
    stop,
    temp_database,
    wait_until,
)

OPERATIONS = ("listInboxes", "searchContacts", "createContact", "listContactableInboxes", "listConversations",
              "createConversation", "listMessages", "createMessage", "listWebhooks", "createWebhook")


def chaos_faults() -> dict[str, dict[str, float | str]]:
    faults: dict[str, dict[str, float | str]] = {op: {"server_error_share": 0.05, "rate_limit_share": 0.02} for op in OPERATIONS}
    faults["createMessage"].update(drop_response_share=0.01, drop_mode="close")
    return faults


def _count(sandbox: Any, events: list[str]) -> dict[str, Any]:
    per_event: Counter[str] = Counter()
    for message in sandbox.messages():
        event = event_of(message.get("content"))
        if event is not None:
            per_event[event] += 1
    stats = sandbox.stats()
    return {
        "events": len(events),
        "messages": sum(per_event[e] for e in events),
        "duplicated_events": sum(1 for e in events if per_event[e] > 1),
        "extra_messages": sum(per_event[e] - 1 for e in events if per_event[e] > 1),
        "lost_events": sum(1 for e in events if per_event[e] == 0),
        "calls": sum(stats["calls"].values()),
        "faults_fired": {op: kinds for op, kinds in stats["faults"].items() if kinds},
    }


def run_baseline(events: list[tuple[str, int]], args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.sandbox_process import running_sandbox

    with running_sandbox(BENCH_SANDBOX) as sandbox:
        sandbox.set_faults(chaos_faults())
        run = naive_client.run(sandbox.base_url, events, threads=args.concurrency, max_tries=args.naive_tries,
                               contact_prefix="naive-patient", phone_prefix="+1555034")
        time.sleep(0.5)
        counted = _count(sandbox, [e for e, _ in events])
        conversations = len({m["conversation_id"] for m in sandbox.messages()})
    return {**counted, "gave_up": run["outcomes"].get("gave_up", 0), "tries": run["tries"], "seconds": run["seconds"],
            "conversations": conversations, "max_tries": args.naive_tries}


def run_ours(events: list[tuple[str, int]], args: argparse.Namespace) -> dict[str, Any]:
    import sqlalchemy as sa

    from dispatcher.enqueue import CeleryEnqueuer
    from dispatcher.service import Dispatcher
    from dispatcher.store.migrate import upgrade_database
    from tests.support.sandbox_process import running_sandbox

    with temp_database() as database_url, private_redis() as broker_url, running_sandbox(BENCH_SANDBOX) as sandbox, \
            tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        upgrade_database(database_url)
        sandbox.set_faults(chaos_faults())
        env = environment(api_url=sandbox.base_url, database_url=database_url, broker_url=broker_url)
        dispatcher = Dispatcher(settings_from(env), enqueuer=CeleryEnqueuer(broker_url))
        engine = dispatcher.sessions.kw["bind"]
        processes = [start_worker(env, Path(tmp) / f"w{i}.log", concurrency=args.concurrency, name=f"w{i}",
                                  queues="dispatcher.send,dispatcher.maintenance") for i in (1, 2)]
        processes.append(start_beat(env, Path(tmp) / "beat.log", Path(tmp) / "beat-schedule"))
        started = time.perf_counter()
        try:
            for event_id, contact in events:
                dispatcher.notify(reminder(event_id, contact, prefix="ours-patient"))
            settled = wait_until(lambda: settled_count(engine, "ours-") >= len(events), timeout_s=args.max_seconds,
                                 what="every notification settled", interval_s=0.5)
            seconds = time.perf_counter() - started
            time.sleep(2.0)  # a duplicate in flight would land by now
        finally:
            for process in processes:
                stop(process)
        counted = _count(sandbox, [e for e, _ in events])
        conversations = len({m["conversation_id"] for m in sandbox.messages()})
        with engine.connect() as connection:
            states = dict(connection.execute(sa.text(
                "SELECT state, count(*) FROM notifications WHERE event_id LIKE 'ours-%' GROUP BY state")).all())
            failures = dict(connection.execute(sa.text(
                "SELECT coalesce(error_kind, '-'), count(*) FROM notifications WHERE event_id LIKE 'ours-%'"
                " AND state = 'failed' GROUP BY 1")).all())
            adopted_or_retried = int(connection.execute(sa.text(
                "SELECT count(*) FROM attempts WHERE tries > 1")).scalar_one())
    return {**counted, "settled": settled, "seconds": round(seconds, 1), "states": states, "failures": failures,
            "attempts_with_more_than_one_try": adopted_or_retried, "conversations": conversations}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--contacts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2, help="baseline threads; processes per worker")
    parser.add_argument("--naive-tries", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=420.0)
    args = parser.parse_args()
    baseline_events = [(f"naive-{n}", n % args.contacts) for n in range(args.events)]
    our_events = [(f"ours-{n}", n % args.contacts) for n in range(args.events)]
    baseline = run_baseline(baseline_events, args)
    ours = run_ours(our_events, args)
    emit({
        "benchmark": "duplicates and losses under the chaos suite's API faults",
        "faults": "every operation: 5% 503, 2% 429; createMessage: 1% responses dropped after commit",
        "events": args.events, "contacts": args.contacts,
        "baseline": baseline, "ours": ours,
        "target": "ours: 0 duplicates, 0 losses",
        "met": ours["duplicated_events"] == 0 and ours["lost_events"] == 0 and ours["settled"],
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
