"""API calls per notification, new and known contacts: the dispatcher against the hand-written
baseline (scripts/bench/naive_client.py), counted by the sandbox's own call counters.

Both run against one sandbox (default seed, no faults), one after the other. The dispatcher
runs as in production: intake from this process, one real Celery worker (Redis broker,
PostgreSQL store). "New": one notification for each of ``--contacts`` contacts the workspace
has never seen; "known": one more notification for each of the same contacts. Calls are the
difference of ``GET /_sandbox/stats`` counters before and after each phase. listInboxes is
counted apart: both read the inbox list once at start-up (the dispatcher once per worker
process and then every 5 minutes), not per notification.

    .venv/bin/python scripts/bench/api_calls.py --contacts 100

Prints JSON: calls per notification for both, per operation, the ratios and the targets
(new: at most 4; known: exactly 1).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
import naive_client
from common import (
    BENCH_SANDBOX,
    accepted_count,
    emit,
    environment,
    private_redis,
    reminder,
    settings_from,
    start_worker,
    stop,
    temp_database,
    wait_until,
)


def _calls(sandbox: Any) -> dict[str, int]:
    return dict(sandbox.stats()["calls"])


def _spent(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {op: after.get(op, 0) - before.get(op, 0) for op in sorted(after) if after.get(op, 0) != before.get(op, 0)}


def _per_notification(spent: dict[str, int], count: int) -> float:
    return round(sum(n for op, n in spent.items() if op != "listInboxes") / count, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contacts", type=int, default=100, help="notifications per phase (one per contact)")
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()

    from dispatcher.enqueue import CeleryEnqueuer
    from dispatcher.service import Dispatcher
    from dispatcher.store.migrate import upgrade_database
    from tests.support.sandbox_process import running_sandbox

    n = args.contacts
    with temp_database() as database_url, private_redis() as broker_url, running_sandbox(BENCH_SANDBOX) as sandbox, \
            tempfile.TemporaryDirectory(prefix="bench-calls-") as tmp:
        upgrade_database(database_url)
        env = environment(api_url=sandbox.base_url, database_url=database_url, broker_url=broker_url)
        dispatcher = Dispatcher(settings_from(env), enqueuer=CeleryEnqueuer(broker_url))
        engine = dispatcher.sessions.kw["bind"]
        worker = start_worker(env, Path(tmp) / "worker.log", concurrency=args.concurrency)
        try:
            phases: dict[str, Any] = {}
            for phase in ("new", "known"):
                before = _calls(sandbox)
                for contact in range(n):
                    dispatcher.notify(reminder(f"ours-{phase}-{contact}", contact, prefix="ours-patient"))
                done = wait_until(lambda p=phase: accepted_count(engine, f"ours-{p}-") >= n, timeout_s=300,
                                  what=f"{n} {phase}-contact notifications")
                time.sleep(0.5)  # nothing else should call; a late call would show here
                spent = _spent(before, _calls(sandbox))
                phases[phase] = {"notifications": n, "accepted": accepted_count(engine, f"ours-{phase}-"), "complete": done,
                                 "calls": spent, "per_notification": _per_notification(spent, n)}
        finally:
            stop(worker)
        ours = phases

        baseline: dict[str, Any] = {}
        for phase in ("new", "known"):
            before = _calls(sandbox)
            run = naive_client.run(sandbox.base_url, [(f"naive-{phase}-{c}", c) for c in range(n)], threads=args.concurrency)
            spent = _spent(before, _calls(sandbox))
            baseline[phase] = {"notifications": n, "outcomes": run["outcomes"], "calls": spent,
                               "per_notification": _per_notification(spent, n)}
        conversations = _conversations_per_contact(sandbox)

    result = {
        "benchmark": "API calls per notification (sandbox call counters)",
        "contacts": n,
        "ours": ours,
        "baseline": baseline,
        "ratio_new": round(ours["new"]["per_notification"] / baseline["new"]["per_notification"], 3),
        "ratio_known": round(ours["known"]["per_notification"] / baseline["known"]["per_notification"], 3),
        "target_new_max": 4,
        "target_known_exact": 1,
        "met_new": ours["new"]["per_notification"] <= 4,
        "met_known": ours["known"]["per_notification"] == 1,
        "conversations_per_contact": conversations,
    }
    emit(result)
    return 0 if ours["new"]["complete"] and ours["known"]["complete"] else 1


def _conversations_per_contact(sandbox: Any) -> dict[str, float]:
    """Threads per contact at the end: the contract asks to reuse one per contact and inbox."""
    by_side: dict[str, dict[int, set[int]]] = {"ours": {}, "baseline": {}}
    for message in sandbox.messages():
        content = message.get("content") or ""
        side = "ours" if content.startswith("Reminder ours-") else "baseline" if content.startswith("Reminder naive-") else None
        if side:
            by_side[side].setdefault(message["contact_id"], set()).add(message["conversation_id"])
    return {side: round(sum(len(c) for c in contacts.values()) / max(len(contacts), 1), 2) for side, contacts in by_side.items()}


if __name__ == "__main__":
    raise SystemExit(main())
