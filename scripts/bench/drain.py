"""Drain against the limits (issue 45): how close a backlog's drain comes to what the workspace's
limits allow, how long urgent notifications wait behind it, and how long another workspace's do.

Every part is a real process at the settings users deploy (the example configuration, no shortened
timers, no lifted limits: 2,400 calls and 90 contact searches a minute): a send worker of
concurrency 2 (``dispatcher worker``'s queues) and beat, a fresh PostgreSQL database, a Redis of the
run's own (the shared limiter, and the broker on ``--broker redis``) or a RabbitMQ virtual host of
its own (``--broker amqp``), and the stock sandbox. Variants, one after the other, each on a stack
of its own:

* ``plain``: first, one reminder to each of ``--known`` recipients (default 90), so that the
  dispatcher knows them (a returning clinic's patients), and a minute's wait for their contact
  searches to leave the limiter's window. Then the drain: ``--notifications`` reminders (default
  5,000), of which ``--new`` (default 200) to recipients the workspace has never seen (each a
  contact search, a create, a conversation and the message), spread evenly among the others, to the
  known recipients (one createMessage each). ``--urgent-after-s`` into the drain, 20 urgent
  reminders to known recipients are handed over.
* ``faults``: the same under the chaos suite's API faults (tests/chaos/chaos_harness.py: 5 % 503
  and 2 % 429 on every operation, 1 % of createMessage answers dropped after the commit).
* ``workspaces``: two workspaces on two sandbox processes. ``down`` has the backlog and answers
  every call with 503; ``north`` gets ``--other`` reminders (default 100, to 20 recipients) once the
  worker is busy with the backlog. Its hand-over-to-sent p99 is set beside the same reminders sent
  with nothing else queued (``north_alone``, measured first on the same stack).

The drain is from the first hand-over to the last send accepted by the workspace. Its floor is what
the limiter's rates allow for the calls the run made (the sandbox's counters): a sliding window of L
a minute grants n calls no sooner than (ceil(n / L) - 1) minutes after the first, for the contact
searches and for all calls; the floor is the larger. (The workspace's own limits, 100 searches and
3,000 calls a minute, give a lower floor still: the configured rates keep a margin under them.)
Throughput under faults is the faults run's notifications a second over the plain run's.

    .venv/bin/python scripts/bench/drain.py --broker redis
    .venv/bin/python scripts/bench/drain.py --broker amqp

Prints JSON (and writes it to docs/results/drain-<broker>-<time>.json with ``--save``). Goals:
drain within 10 % of the floor without faults, throughput under faults at least 0.8 of it, urgent
hand-over to sent p99 at most 10 s behind the backlog.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
import sqlalchemy as sa  # noqa: E402
from common import (
    REPO,
    deployed_environment,
    emit,
    private_redis,
    reminder,
    settings_from,
    start_beat,
    start_worker,
    stop,
    temp_database,
    wait_until,
)

URGENT = 20
OTHER_RECIPIENTS = 20
WORKSPACE_FAULTS = ("listInboxes", "searchContacts", "createContact", "listContactableInboxes", "createConversation",
                    "createMessage")


@dataclass
class Stack:
    dispatcher: Any
    engine: sa.Engine
    settings: Any
    sandboxes: dict[str, Any]


@contextlib.contextmanager
def _broker(kind: str, redis_url: str) -> Iterator[str]:
    if kind == "redis":
        yield redis_url
        return  # amqp, or rabbitmq as scripts/bench/run_all.py names it
    from tests.support.rabbitmq_vhost import RABBITMQ_HOST, RABBITMQ_PORT, private_vhost

    with private_vhost("bench-drain") as vhost:
        yield f"amqp://guest:guest@{RABBITMQ_HOST}:{RABBITMQ_PORT}/{vhost}"


@contextlib.contextmanager
def running_stack(variant: str, args: argparse.Namespace, logs: Path) -> Iterator[Stack]:
    from dispatcher.enqueue import CeleryEnqueuer
    from dispatcher.service import Dispatcher
    from dispatcher.store.migrate import upgrade_database
    from tests.support.sandbox_process import running_sandbox

    logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        database_url = stack.enter_context(temp_database())
        redis_url = stack.enter_context(private_redis())
        broker_url = stack.enter_context(_broker(args.broker, redis_url))
        main = stack.enter_context(running_sandbox())
        sandboxes = {"default": main}
        extra: dict[str, str] = {"DISPATCHER_REDIS_URL": redis_url}
        if variant == "workspaces":
            north = stack.enter_context(running_sandbox())
            sandboxes["north"] = north
            extra["DISPATCHER_WORKSPACES"] = json.dumps({"north": {
                "api_url": north.base_url, "account_id": 1, "api_token": "sandbox-token-account-1"}})
        upgrade_database(database_url)
        env = deployed_environment(api_url=main.base_url, database_url=database_url, broker_url=broker_url, **extra)
        settings = settings_from(env)
        enqueuer = CeleryEnqueuer(broker_url, queues=settings.send_queues)
        stack.callback(enqueuer.close)
        dispatcher = Dispatcher(settings, enqueuer=enqueuer)
        worker = start_worker(env, logs / f"{variant}-send.log", concurrency=args.concurrency, name="send",
                              queues="dispatcher.send,dispatcher.maintenance")
        stack.callback(stop, worker)
        beat = start_beat(env, logs / f"{variant}-beat.log", logs / f"{variant}-beat-schedule")
        stack.callback(stop, beat)
        if variant == "faults":
            from tests.chaos.chaos_harness import sandbox_faults

            main.set_faults(sandbox_faults())
        yield Stack(dispatcher, dispatcher.sessions.kw["bind"], settings, sandboxes)


# -- the store's side --------------------------------------------------------------------------

def _left(engine: sa.Engine, prefix: str) -> int:
    """The prefix's notifications not yet out of the send queue: neither accepted nor failed."""
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            "SELECT count(*) FROM notifications WHERE event_id LIKE :p AND accepted_at IS NULL AND state <> 'failed'"),
            {"p": f"{prefix}-%"}).scalar_one())


def _sent_times(engine: sa.Engine, prefix: str) -> tuple[list[float], float | None, float | None, int, int]:
    """Hand-over-to-accepted seconds of the prefix's accepted notifications (sorted), the first hand-over
    and the last acceptance (unix seconds), how many were accepted and how many failed."""
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            "SELECT extract(epoch FROM created_at), extract(epoch FROM accepted_at), state FROM notifications"
            " WHERE event_id LIKE :p"), {"p": f"{prefix}-%"}).all()
    waits = sorted(float(accepted) - float(created) for created, accepted, _ in rows if accepted is not None)
    first = min((float(created) for created, _, _ in rows), default=None)
    last = max((float(accepted) for _, accepted, _ in rows if accepted is not None), default=None)
    return waits, first, last, len(waits), sum(1 for _, _, state in rows if state == "failed")


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, math.ceil(share * len(values)) - 1)], 2)


def _floor_s(grants: int, per_minute: int) -> float:
    """The soonest a sliding window of ``per_minute`` grants ``grants``, from the first: (ceil(n/L) - 1) minutes."""
    return max(0, math.ceil(grants / per_minute) - 1) * 60.0


def _hand_over(stack: Stack, requests: list[dict[str, Any]]) -> None:
    for start in range(0, len(requests), 1000):
        results = stack.dispatcher.notify_many(requests[start:start + 1000])
        refused = [result for result in results if result.outcome.value != "accepted"]
        if refused:
            raise SystemExit(f"the dispatcher refused {len(refused)} requests: {refused[0]}")


PHONE_PREFIXES = {"busy": "+1555044"}  # recipients of their own (the others: common.PHONE_PREFIX)


def _reminders(prefix: str, count: int, contacts: int, **extra: Any) -> list[dict[str, Any]]:
    """Each recipient's first reminder first (new contacts), then the others round-robin (known ones)."""
    phones = {"phone_prefix": PHONE_PREFIXES[prefix]} if prefix in PHONE_PREFIXES else {}
    return [{**reminder(f"{prefix}-{number:05d}", number % contacts, prefix=f"drain-{prefix}", **phones), **extra}
            for number in range(count)]


def _faults_fired(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """The sandbox's injected faults in the span, by kind (429, 503, a dropped answer ...)."""
    totals: dict[str, int] = {}
    for operation, kinds in after.get("faults", {}).items():
        for kind, count in kinds.items():
            totals[kind] = totals.get(kind, 0) + count - before.get("faults", {}).get(operation, {}).get(kind, 0)
    return {kind: count for kind, count in sorted(totals.items()) if count}


def _calls(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    return {operation: after["calls"].get(operation, 0) - before["calls"].get(operation, 0)
            for operation in sorted(after["calls"]) if after["calls"].get(operation, 0) != before["calls"].get(operation, 0)}


# -- the variants ------------------------------------------------------------------------------

def _mix(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--notifications`` reminders: ``--new`` to new recipients (numbers from 10,000 up), spread
    evenly, the rest to the ``--known`` ones in turn."""
    every = max(1, args.notifications // max(args.new, 1))
    requests, new, known = [], 0, 0
    for number in range(args.notifications):
        if new < args.new and number % every == every - 1:
            contact, new = 10_000 + new, new + 1
        else:
            contact, known = known % args.known, known + 1
        requests.append(reminder(f"backlog-{number:05d}", contact, prefix="drain-patient"))
    return requests


def drain(stack: Stack, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    settings = stack.settings
    sandbox = stack.sandboxes["default"]
    # the known recipients: one reminder each, then a minute for their searches to leave the window
    _hand_over(stack, [reminder(f"warm-{n:05d}", n, prefix="drain-patient") for n in range(args.known)])
    wait_until(lambda: _left(stack.engine, "warm") == 0, timeout_s=args.timeout_s, what="the known recipients")
    time.sleep(61.0)
    before = sandbox.stats()
    began = time.monotonic()
    _hand_over(stack, _mix(args))
    handover_s = time.monotonic() - began
    urgent_at = None
    if args.urgent_after_s is not None:
        time.sleep(max(0.0, args.urgent_after_s - (time.monotonic() - began)))
        urgent_at = round(time.monotonic() - began, 1)
        # to known recipients
        _hand_over(stack, [{**reminder(f"urgent-{n:02d}", n, prefix="drain-patient"), "priority": "urgent"}
                           for n in range(URGENT)])
    drained = wait_until(lambda: _left(stack.engine, "backlog") == 0 and _left(stack.engine, "urgent") == 0,
                         timeout_s=args.timeout_s, what=f"the backlog drained ({variant})", interval_s=1.0)
    after = sandbox.stats()
    calls = _calls(before, after)
    waits, first, last, sent, failed = _sent_times(stack.engine, "backlog")
    urgent_waits, _, _, urgent_sent, _ = _sent_times(stack.engine, "urgent")
    drain_s = round(last - first, 1) if first is not None and last is not None else None
    searches = calls.get("searchContacts", 0)
    total_calls = sum(calls.values())
    floor_s = max(_floor_s(searches, settings.contact_searches_per_minute),
                  _floor_s(total_calls, settings.api_requests_per_minute))
    workspace_floor_s = max(_floor_s(searches, 100), _floor_s(total_calls, 3000))
    return {
        "variant": variant, "notifications": args.notifications, "new_recipients": args.new,
        "known_recipients": args.known, "drained": drained, "faults_fired": _faults_fired(before, after),
        "handover_s": round(handover_s, 1), "sent": sent, "failed": failed, "drain_s": drain_s,
        "notifications_per_s": round(sent / drain_s, 2) if drain_s else None,
        "calls": calls, "calls_total": total_calls,
        "floor_s": floor_s, "drain_over_floor": round(drain_s / floor_s, 3) if drain_s and floor_s else None,
        "floor_at_the_workspaces_limits_s": workspace_floor_s,
        "handover_to_sent_p50_s": _percentile(waits, 0.5), "handover_to_sent_p99_s": _percentile(waits, 0.99),
        "urgent": {"handed_over_at_s": urgent_at, "sent": urgent_sent,
                   "handover_to_sent_p50_s": _percentile(urgent_waits, 0.5),
                   "handover_to_sent_p99_s": _percentile(urgent_waits, 0.99),
                   "handover_to_sent_max_s": round(urgent_waits[-1], 2) if urgent_waits else None},
    }


def workspaces(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    north = [{**request, "workspace": "north"} for request in _reminders("alone", args.other, OTHER_RECIPIENTS)]
    _hand_over(stack, north)
    wait_until(lambda: _left(stack.engine, "alone") == 0, timeout_s=args.timeout_s, what="north alone", interval_s=0.5)
    alone, _, _, alone_sent, _ = _sent_times(stack.engine, "alone")
    stack.sandboxes["default"].set_faults({operation: {"server_error_share": 1.0} for operation in WORKSPACE_FAULTS})
    _hand_over(stack, _reminders("down", args.notifications, args.contacts))
    time.sleep(2.0)  # the worker is busy with the backlog (its breaker not yet open)
    # as many reminders to as many recipients new to north as when it was alone
    busy = [{**request, "workspace": "north"} for request in _reminders("busy", args.other, OTHER_RECIPIENTS)]
    _hand_over(stack, busy)
    wait_until(lambda: _left(stack.engine, "busy") == 0, timeout_s=args.timeout_s, what="north beside the backlog",
               interval_s=0.5)
    beside, _, _, beside_sent, _ = _sent_times(stack.engine, "busy")
    with stack.engine.connect() as connection:
        down = {str(kind): int(count) for kind, count in connection.execute(sa.text(
            "SELECT coalesce(error_kind, '-'), count(*) FROM notifications WHERE workspace = 'default' GROUP BY 1"))}
        down_tries = int(connection.execute(sa.text(
            "SELECT coalesce(sum(tries), 0) FROM attempts WHERE workspace = 'default'")).scalar_one())
    p99_alone, p99_beside = _percentile(alone, 0.99), _percentile(beside, 0.99)
    return {
        "variant": "workspaces", "down_backlog": args.notifications, "north": args.other,
        "north_alone": {"sent": alone_sent, "p50_s": _percentile(alone, 0.5), "p99_s": p99_alone},
        "north_beside_the_down_backlog": {"sent": beside_sent, "p50_s": _percentile(beside, 0.5), "p99_s": p99_beside},
        "p99_beside_over_alone": round(p99_beside / p99_alone, 2) if p99_alone and p99_beside else None,
        "down_workspace": {"error_kinds": down, "failed_calls": down_tries},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=["redis", "amqp", "rabbitmq"], default="redis")
    parser.add_argument("--variants", default="plain,faults,workspaces")
    parser.add_argument("--notifications", type=int, default=5000)
    parser.add_argument("--new", type=int, default=200, help="recipients the workspace has never seen")
    parser.add_argument("--known", type=int, default=90, help="recipients the dispatcher knows before the drain")
    parser.add_argument("--contacts", type=int, default=200, help="the workspace that is down: its recipients")
    parser.add_argument("--other", type=int, default=100)
    parser.add_argument("--urgent-after-s", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--save", action="store_true", help="also write docs/results/drain-<broker>-<time>.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"benchmark": "drain", "broker": args.broker,
                               "started_at": datetime.now(UTC).isoformat(timespec="seconds"), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        for variant in args.variants.split(","):
            with running_stack(variant, args, Path(tmp)) as stack:
                results["runs"][variant] = workspaces(stack, args) if variant == "workspaces" else drain(stack, variant, args)
            print(json.dumps(results["runs"][variant]), flush=True)
    runs = results["runs"]
    if "plain" in runs and "faults" in runs and runs["plain"]["notifications_per_s"] and runs["faults"]["notifications_per_s"]:
        results["throughput_under_faults_over_plain"] = round(
            runs["faults"]["notifications_per_s"] / runs["plain"]["notifications_per_s"], 3)
    emit(results)
    if args.save:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
        (REPO / "docs" / "results" / f"drain-{args.broker}-{stamp}.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
