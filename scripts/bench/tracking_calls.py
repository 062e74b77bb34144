"""Tracking's API calls (issue 44): calls per notification by operation with tracking's status
reads, listMessages per outgoing message and the reads' share of the limiter, for new and known
contacts, without and with the chaos suite's faults.

scripts/bench/api_calls.py counts the send path alone (a worker, no webhooks), so it never sees a
status read. This runs the whole product as deployed, every part a real process: intake from this
process (``notify()``), a send worker (``dispatcher worker``'s queues: send and maintenance,
concurrency 2), the receiver (``dispatcher receiver``) with the sandbox's signed webhooks
registered to it, an outcome consumer (concurrency 2) and beat; a Redis of the run's own (broker
and shared limiter) and a fresh PostgreSQL database. The dispatcher keeps the example
configuration's values: no shortened timers, no lifted limits (2,400 calls and 90 contact searches
a minute, reads at most 0.2 of the calls, ``reconcile_after_s`` 60 s, sweeps every 5 s). The
sandbox is the stock profile with its default seed and timings (delivered 0.5 s after the send,
read 1.5 s later, the late ``sent`` 0.75 s after delivered).

Each variant runs on a stack of its own (sandbox, database, Redis, processes), one after the other:

* ``plain``: no fault;
* ``faults``: the chaos suite's (tests/chaos/chaos_harness.py): 5 % 503 and 2 % 429 on every
  operation the dispatcher calls, 1 % of createMessage answers dropped after the commit; the
  sandbox's webhooks dropped 5 %, duplicated 10 %, reordered 10 %. Nothing is killed.

and in each, two phases: ``--notifications`` reminders to as many contacts the workspace has never
seen (``new``), then one more to each of them (``known``). The recipients (by contact number, the
same in both phases): about 85 % read their reminder; 10 % (``+1555071``) have it delivered, then a
late ``sent`` overwrites the status in the workspace and they never read it (they must end
``delivered`` with no fallback); 5 % (``+1555010``) are refused by the platform with 131026 and get
the SMS fallback.

A phase hands its reminders over, waits until every one is settled (read, delivered or failed, or
sent with its fallback decided), then keeps observing: at least ``reconcile_after_s`` and two sweeps
more, and on until no read-back the rule schedules is left for the phase's attempts and every
webhook delivery is processed (at most ``--max-window-s``). Calls are the difference of the
sandbox's ``GET /_sandbox/stats`` counters before and after the phase (listInboxes apart, as in
api_calls.py: read once per worker process and every 5 minutes, not per notification); the
limiter's grants by bucket are read from the run's Redis over the same span (common.LimiterGrants:
``reads`` / ``account`` is the status reads' share).

The baseline, counted in the same run: a client that reads the message list for every stock event
makes one listMessages per status-less ``message_updated`` (a stock workspace puts no status at the
top level of any of them). The receiver's own records (``webhook_deliveries``, the phase's span)
say how many it got; ``ratio`` is our listMessages over that count.

    .venv/bin/python scripts/bench/tracking_calls.py --notifications 100

Prints JSON: per variant and phase, calls by operation and per notification, listMessages and
status reads per outgoing message, the baseline and the ratio, the limiter's grants, how the
notifications ended and the wrong fallbacks (a fallback for a notification whose platform message
the sandbox saw reach delivered or read: must be 0). Targets: at most 1 listMessages a message
without faults, at most 1.2 under faults, 0 wrong fallbacks.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
import sqlalchemy as sa  # noqa: E402
from common import (
    PHONE_PREFIX,
    LimiterGrants,
    deployed_environment,
    emit,
    event_of,
    private_redis,
    reminder,
    settings_from,
    start_beat,
    start_worker,
    stop,
    temp_database,
    wait_until,
)
from end_to_end import answers, start_receiver

PHASES = ("new", "known")
VARIANTS = ("plain", "faults")
TARGET_READS_PER_MESSAGE = {"plain": 1.0, "faults": 1.2}
PLATFORM_INBOX, SMS_INBOX = 1, 2

# The recipients, by contact number (the sandbox's default seed decides what happens to them).
MIX = {
    "reads": {"phone_prefix": PHONE_PREFIX, "what": "no rule: delivered 0.5 s after the send, read 1.5 s later"},
    "overwritten": {"phone_prefix": "+1555071", "what": "delivered, then a late `sent` overwrites it 0.75 s later;"
                    " never read (must end delivered, no fallback)"},
    "undeliverable": {"phone_prefix": "+1555010", "what": "131026 on the platform; the SMS fallback is delivered"},
}
# kind -> (the notification's final state, its fallback decision)
EXPECTED = {"reads": ("read", None), "overwritten": ("delivered", None), "undeliverable": ("delivered", "fallback")}


def kind_of(contact: int) -> str:
    """One contact in ten is overwritten, one in twenty undeliverable, the rest read."""
    if contact % 10 == 4:
        return "overwritten"
    if contact % 20 == 9:
        return "undeliverable"
    return "reads"


def request(phase: str, contact: int) -> dict[str, Any]:
    return reminder(f"{phase}-{contact:04d}", contact, prefix="tracking-patient",
                    phone_prefix=MIX[kind_of(contact)]["phone_prefix"])


def sandbox_config(variant: str) -> str | None:
    """The stock sandbox's default seed and timings; under faults, the chaos suite's webhook faults."""
    if variant == "plain":
        return None
    from tests.chaos.chaos_harness import WEBHOOK_DROP_SHARE, WEBHOOK_DUPLICATE_SHARE, WEBHOOK_REORDER_SHARE

    return (f"[webhooks]\ndrop_share = {WEBHOOK_DROP_SHARE}\nduplicate_share = {WEBHOOK_DUPLICATE_SHARE}\n"
            f"reorder_share = {WEBHOOK_REORDER_SHARE}\n")


def api_faults() -> dict[str, dict[str, Any]]:
    from tests.chaos.chaos_harness import sandbox_faults

    return sandbox_faults()


@dataclass
class Stack:
    sandbox: Any
    dispatcher: Any
    engine: sa.Engine
    redis_url: str
    settings: Any


@contextlib.contextmanager
def running_stack(variant: str, args: argparse.Namespace, logs: Path) -> Iterator[Stack]:
    from dispatcher.api.client import WorkspaceClient
    from dispatcher.enqueue import CeleryEnqueuer
    from dispatcher.queues import MAINTENANCE_QUEUE, OUTCOMES_QUEUE, SEND_QUEUE
    from dispatcher.service import Dispatcher
    from dispatcher.store.migrate import upgrade_database
    from tests.support.sandbox_process import free_port, running_sandbox

    logs.mkdir(parents=True, exist_ok=True)
    with temp_database() as database_url, private_redis() as redis_url, \
            running_sandbox(sandbox_config(variant)) as sandbox:
        upgrade_database(database_url)
        env = deployed_environment(api_url=sandbox.base_url, database_url=database_url, broker_url=redis_url,
                                   DISPATCHER_REDIS_URL=redis_url)
        settings = settings_from(env)
        port = free_port()
        with WorkspaceClient.from_settings(settings) as client:
            webhook = client.create_webhook(url=f"http://127.0.0.1:{port}{settings.webhook_path}",
                                            subscriptions=["message_created", "message_updated"])
        assert webhook.secret is not None
        env["DISPATCHER_WEBHOOK_SECRETS"] = webhook.secret.get_secret_value()
        settings = settings_from(env)
        enqueuer = CeleryEnqueuer(redis_url)
        dispatcher = Dispatcher(settings, enqueuer=enqueuer)
        processes = [
            start_receiver(env, port, logs / "receiver.log"),
            start_worker(env, logs / "send.log", concurrency=args.concurrency, name="send",
                         queues=f"{SEND_QUEUE},{MAINTENANCE_QUEUE}"),  # what `dispatcher worker` serves
            start_worker(env, logs / "consumer.log", concurrency=args.concurrency, name="consumer",
                         queues=OUTCOMES_QUEUE),
            start_beat(env, logs / "beat.log", logs / "beat-schedule"),
        ]
        try:
            if not wait_until(lambda: answers(f"http://127.0.0.1:{port}/healthz"), timeout_s=30, what="the receiver"):
                raise SystemExit(f"the receiver did not start; see {logs / 'receiver.log'}")
            if variant == "faults":
                sandbox.set_faults(api_faults())
            yield Stack(sandbox, dispatcher, dispatcher.sessions.kw["bind"], redis_url, settings)
        finally:
            for process in processes:
                stop(process)
            enqueuer.close()


# -- the store's side --------------------------------------------------------------------------

SETTLED = ("(n.state IN ('read', 'delivered', 'failed')"
           " OR (n.state = 'sent' AND n.fallback_decision IS NOT NULL))")


def unsettled(engine: sa.Engine, phase: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            f"SELECT count(*) FROM notifications n WHERE n.event_id LIKE :p AND NOT {SETTLED}"),
            {"p": f"{phase}-%"}).scalar_one())


def reads_scheduled(engine: sa.Engine, phase: str) -> int:
    """The phase's attempts a read-back is still scheduled for, as the tracking sweep chooses them
    (dispatcher.lifecycle.worklists.take_due_reads, without the 'due now')."""
    from dispatcher.lifecycle.states import AFTER_DECISION_PURPOSES
    from dispatcher.policy.readback import READ_BACK_STATES
    from dispatcher.store.models import Attempt, Notification

    query = (sa.select(sa.func.count()).select_from(Attempt)
             .join(Notification, Notification.id == Attempt.notification_id)
             .where(Notification.event_id.like(f"{phase}-%"),
                    Attempt.state.in_(sorted(READ_BACK_STATES)), Attempt.message_id.is_not(None),
                    Attempt.next_read_at.is_not(None), Attempt.number == Notification.current_attempt,
                    sa.or_(Attempt.purpose.in_(sorted(AFTER_DECISION_PURPOSES)),
                           Notification.fallback_decision.is_(None))))
    with engine.connect() as connection:
        return int(connection.execute(query).scalar_one())


def unprocessed_deliveries(engine: sa.Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            "SELECT count(*) FROM webhook_deliveries WHERE processed_at IS NULL")).scalar_one())


def status_less_updates(engine: sa.Engine, began: datetime, ended: datetime) -> dict[str, int]:
    """The receiver's ``message_updated`` deliveries of outgoing messages in the span: all of them
    (a stock workspace puts a status at the top level of none), those whose summary found no status
    either (their message was not its conversation's latest: what our rule may read for), and the
    distinct updates among them (copies share a body digest)."""
    with engine.connect() as connection:
        row = connection.execute(sa.text(
            "SELECT count(*), count(*) FILTER (WHERE summary->>'status' IS NULL),"
            " count(DISTINCT coalesce(summary->>'body_digest', delivery_id))"
            " FROM webhook_deliveries WHERE event = 'message_updated'"
            " AND coalesce(summary->>'message_type', '') <> 'incoming'"
            " AND received_at >= :began AND received_at < :ended"), {"began": began, "ended": ended}).one()
        created = int(connection.execute(sa.text(
            "SELECT count(*) FROM webhook_deliveries WHERE event = 'message_created'"
            " AND received_at >= :began AND received_at < :ended"), {"began": began, "ended": ended}).scalar_one())
    return {"message_updated": int(row[0]), "without_status_even_in_the_latest_message": int(row[1]),
            "distinct_updates": int(row[2]), "message_created": created}


def delivery_outcomes(engine: sa.Engine, began: datetime, ended: datetime) -> dict[str, int]:
    with engine.connect() as connection:
        return {str(outcome or "(none)"): int(count) for outcome, count in connection.execute(sa.text(
            "SELECT outcome, count(*) FROM webhook_deliveries WHERE received_at >= :began AND received_at < :ended"
            " GROUP BY outcome ORDER BY count(*) DESC"), {"began": began, "ended": ended})}


def notifications(engine: sa.Engine, phase: str) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        return [dict(row) for row in connection.execute(sa.text(
            "SELECT n.event_id, n.state, n.fallback_decision, n.fallback_reason, a.message_id AS first_message_id"
            " FROM notifications n LEFT JOIN attempts a ON a.notification_id = n.id AND a.number = 1"
            " WHERE n.event_id LIKE :p ORDER BY n.event_id"), {"p": f"{phase}-%"}).mappings()]


# -- one phase ---------------------------------------------------------------------------------

def _difference(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after.get(key, 0) - before.get(key, 0) for key in sorted(after)
            if after.get(key, 0) != before.get(key, 0)}


def _faults_fired(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for operation, kinds in after.items():
        for kind, count in kinds.items():
            totals[kind] += count - before.get(operation, {}).get(kind, 0)
    return {kind: count for kind, count in sorted(totals.items()) if count}


def run_phase(stack: Stack, phase: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    n = args.notifications
    settings = stack.settings
    min_window_s = settings.reconcile_after_s + 2 * settings.sweep_interval_s
    before = stack.sandbox.stats()
    began_at = datetime.now(UTC)
    began = time.monotonic()
    with LimiterGrants(stack.redis_url) as grants:
        for contact in range(n):
            stack.dispatcher.notify(request(phase, contact))
        handover_s = time.monotonic() - began
        settled = wait_until(lambda: unsettled(stack.engine, phase) == 0, timeout_s=args.settle_timeout_s,
                             what=f"every {phase}-contact notification settled ({variant})", interval_s=1.0)
        settled_s = time.monotonic() - began
        window_began = time.monotonic()
        ended_by = "the cap (--max-window-s)"
        while time.monotonic() - window_began < args.max_window_s:
            if time.monotonic() - window_began >= min_window_s and reads_scheduled(stack.engine, phase) == 0 \
                    and unprocessed_deliveries(stack.engine) == 0:
                ended_by = "no read-back scheduled, every delivery processed"
                break
            time.sleep(1.0)
        window_s = time.monotonic() - window_began
        after = stack.sandbox.stats()
    ended_at = datetime.now(UTC)

    calls = _difference(before["calls"], after["calls"])
    list_inboxes = calls.pop("listInboxes", 0)
    messages = stack.sandbox.messages()
    reached = {m["id"]: m.get("highest_status") or m.get("status") for m in messages}
    first_messages: Counter[str] = Counter()
    outgoing = 0
    for message in messages:
        event = event_of(message.get("content"))
        if event is None or not event.startswith(f"{phase}-") or message["inbox_id"] not in (PLATFORM_INBOX, SMS_INBOX):
            continue
        outgoing += 1
        if message["inbox_id"] == PLATFORM_INBOX:
            first_messages[event] += 1
    rows = notifications(stack.engine, phase)
    by_kind: dict[str, Counter[str]] = {}
    wrong_fallbacks, unexpected = [], []
    for row in rows:
        kind = kind_of(int(row["event_id"].split("-", 1)[1]))
        by_kind.setdefault(kind, Counter())[f"{row['state']}{' + ' + row['fallback_decision'] if row['fallback_decision'] else ''}"] += 1
        if row["fallback_decision"] == "fallback" and reached.get(row["first_message_id"]) in ("delivered", "read"):
            wrong_fallbacks.append(row["event_id"])
        if (row["state"], row["fallback_decision"]) != EXPECTED[kind]:
            unexpected.append(f"{row['event_id']} ({kind}): {row['state']}, decision {row['fallback_decision']}"
                              f" ({row['fallback_reason']})")
    list_messages = calls.get("listMessages", 0)
    limiter = grants.summary()
    status_reads = limiter["by_bucket"].get("reads", 0)
    updates = status_less_updates(stack.engine, began_at, ended_at)
    total = sum(calls.values())
    target = TARGET_READS_PER_MESSAGE[variant]
    reads_per_message = round(list_messages / outgoing, 3) if outgoing else None
    return {
        "notifications": n, "started_at": began_at.isoformat(timespec="seconds"),
        "handover_s": round(handover_s, 1), "settled": settled, "settled_after_s": round(settled_s, 1),
        "window_s": round(window_s, 1), "window_ended_by": ended_by,
        "reads_still_scheduled": reads_scheduled(stack.engine, phase),
        "calls": calls, "list_inboxes": list_inboxes,
        "calls_per_notification_by_operation": {op: round(count / n, 3) for op, count in calls.items()},
        "calls_per_notification": round(total / n, 3),
        "faults_fired": _faults_fired(before.get("faults", {}), after.get("faults", {})),
        "sandbox_webhooks": _difference(before.get("webhooks", {}), after.get("webhooks", {})),
        "outgoing_messages": outgoing,
        "list_messages": list_messages,
        "list_messages_per_message": reads_per_message,
        "status_reads": status_reads,  # the limiter's `reads` grants: the send path's reads before a resend are not among them
        "status_reads_per_message": round(status_reads / outgoing, 3) if outgoing else None,
        "limiter_grants": {**limiter, "api_requests_per_minute": settings.api_requests_per_minute,
                           "reads_fraction_of_api_requests": settings.reads_fraction_of_api_requests},
        "baseline": {**updates, "what": "one listMessages per status-less message_updated the receiver got",
                     "reads_per_message": round(updates["message_updated"] / outgoing, 3) if outgoing else None},
        "ratio_to_baseline": round(list_messages / updates["message_updated"], 3) if updates["message_updated"] else None,
        "states": dict(Counter(row["state"] for row in rows)),
        "fallbacks": sum(1 for row in rows if row["fallback_decision"] == "fallback"),
        "by_kind": {kind: dict(counts) for kind, counts in sorted(by_kind.items())},
        "unexpected_outcomes": unexpected,
        "wrong_fallbacks": len(wrong_fallbacks), "wrong_fallback_events": wrong_fallbacks,
        "events_with_two_first_messages": sum(1 for count in first_messages.values() if count > 1),
        "events_without_first_message": sum(1 for row in rows if first_messages[row["event_id"]] == 0),
        "delivery_outcomes": delivery_outcomes(stack.engine, began_at, ended_at),
        "target_list_messages_per_message": target,
        "met": reads_per_message is not None and reads_per_message <= target and not wrong_fallbacks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notifications", type=int, default=100, help="reminders per phase, one per contact")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes of the send worker and of the consumer")
    parser.add_argument("--settle-timeout-s", type=float, default=600.0,
                        help="longest wait for a phase's notifications to settle (the phase is then reported incomplete)")
    parser.add_argument("--max-window-s", type=float, default=300.0,
                        help="longest observation after a phase settled (at least reconcile_after_s and two sweeps)")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs in this folder (default: a temporary one)")
    args = parser.parse_args()

    n = args.notifications
    mix = {kind: {**about, "contacts": sum(1 for contact in range(n) if kind_of(contact) == kind)}
           for kind, about in MIX.items()}
    variants: dict[str, Any] = {}
    settings_used: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        for variant in args.variants:
            logs = (args.logs or Path(tmp)) / variant
            with running_stack(variant, args, logs) as stack:
                s = stack.settings
                settings_used = {
                    "api_requests_per_minute": s.api_requests_per_minute,
                    "contact_searches_per_minute": s.contact_searches_per_minute,
                    "reads_fraction_of_api_requests": s.reads_fraction_of_api_requests,
                    "reconcile_after_s": s.reconcile_after_s, "sweep_interval_s": s.sweep_interval_s,
                    "status_read_wait_s": s.status_read_wait_s,
                    "reminders_delivery_deadline_s": s.routes["reminders"].delivery_deadline_s,
                }
                phases = {phase: run_phase(stack, phase, variant, args) for phase in PHASES}
            variants[variant] = {
                "faults": None if variant == "plain" else {
                    "api": "every operation the dispatcher calls: 5% 503, 2% 429; createMessage: 1% answers dropped"
                           " after the commit",
                    "webhooks": "5% dropped, 10% duplicated, 10% reordered"},
                "phases": phases,
            }
    min_window = settings_used["reconcile_after_s"] + 2 * settings_used["sweep_interval_s"]
    emit({
        "benchmark": "tracking's API calls per notification, reads per message, the reads' share of the limiter",
        "notifications_per_phase": n, "concurrency": args.concurrency, "mix": mix,
        "settings": settings_used,
        "sandbox": "stock profile, default seed and timings (delivered 0.5 s after the send, read 1.5 s later, the"
                   " late sent 0.75 s after delivered)",
        "window": {"min_s": min_window, "max_s": args.max_window_s,
                   "rule": f"after every notification settled: at least reconcile_after_s + 2 sweeps ({min_window:.0f} s),"
                           " then until no read-back is scheduled for the phase and every delivery is processed"},
        "variants": variants,
        "met": all(phase["met"] for v in variants.values() for phase in v["phases"].values()),
    })
    whole = all(phase["settled"] for v in variants.values() for phase in v["phases"].values())
    return 0 if whole else 1


if __name__ == "__main__":
    raise SystemExit(main())
