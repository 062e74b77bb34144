"""Proof under fire: notifications through every real process while a seeded controller kills
send workers, consumers, the relay, beat and the receiver, loses a send worker for good, restarts
PostgreSQL and the broker, and the sandbox misbehaves, all at the settings a user deploys; then
the dispatcher's store is checked against the sandbox's own record. On Redis (500 notifications,
50 kills) and on RabbitMQ (300, 30: issue 22). See docs/chaos.md.

    .venv/bin/pytest tests/chaos -q                      # a fresh seed, printed
    CHAOS_SEED=123 .venv/bin/pytest tests/chaos -q -k rabbitmq   # replay the seed's random choices
    scripts/chaos --broker rabbitmq --notifications 2000 --kills 200
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from chaos_harness import (
    BROKERS,
    LOST_NODE_BOUND_S,
    RATIO_FLOOR,
    SENDERS,
    UNSENT_WINDOW,
    ChaosConfig,
    Controller,
    IntakeProgress,
    Planned,
    Sampler,
    calls_per_notification,
    check,
    delivery_outcomes,
    dump_event,
    error_kinds,
    lost_node_handoff,
    messages_by_event,
    percentiles,
    plan_notifications,
    private_data_in,
    read_store,
    reads_not_followed,
    reads_per_message,
    running_stack,
    set_aside,
    settings_of,
    settle_s,
    settled_state,
    store_dump,
    time_budget_s,
    unprocessed_deliveries,
    updates_received,
)

from dispatcher.store.models import Notification
from tests.conftest import REPO_ROOT

# xdist_group: the chaos run is the longest test by far; its own group lets the other worker take the rest meanwhile
pytestmark = [pytest.mark.integration, pytest.mark.timeout(time_budget_s()), pytest.mark.xdist_group("chaos")]

TEARDOWN_RESERVE_S = 75.0  # kept back from the budget for the checks, the report and stopping everything
# Nothing changing for this long means stuck: longer than the 30 s before lost deliveries are
# republished and the minute before a read-back, and than the route's delivery deadline.
STALL_S = 90.0
DECISION_LINE = re.compile(r"notification (\d+): fallback decision (\w+)")
TASK_RESULT = re.compile(r"Task (dispatcher\.\w+)\[[^\]]+\] succeeded in [0-9.]+s: '?(\w+)")
TASK_RAISED = re.compile(r"Task (dispatcher\.\w+)\[[^\]]+\] raised unexpected: (\w+)")
POOL_PROCESS_REPLACED = re.compile(r"Process 'ForkPoolWorker-\d+' pid:\d+ exited with 'signal 9 \(SIGKILL\)'")


HAND_OVER_PATIENCE_S = 30.0  # a host retries a failed hand-over this long: PostgreSQL or the broker restarting


@pytest.mark.parametrize("broker", BROKERS)
def test_notifications_under_fire_lose_nothing_and_duplicate_nothing(
    broker: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], record_property: Any,
) -> None:
    chosen = os.environ.get("CHAOS_BROKER", "").strip()
    if chosen and chosen != broker:
        pytest.skip(f"CHAOS_BROKER={chosen}: only that broker's run")
    config = ChaosConfig.from_environment(broker)
    budget_s = time_budget_s()
    began = time.monotonic()

    def say(text: str) -> None:  # to the terminal even without -s: the counts belong in CI's output
        with capsys.disabled():
            sys.stdout.write(f"\n[chaos] {text}")
            sys.stdout.flush()

    say(f"seed {config.seed} (replay with CHAOS_SEED={config.seed} ... -k {broker}); broker {broker}, "
        f"{config.notifications} notifications, at least {config.kills} kills, budget {budget_s:.0f} s")
    record_property("chaos_seed", config.seed)
    planned = plan_notifications(random.Random(f"workload-{config.seed}"), config.notifications)
    controller_rng = random.Random(f"controller-{config.seed}")
    log_dir = tmp_path / "logs"
    engine: sa.Engine | None = None
    try:
        with running_stack(config, log_dir=log_dir) as stack:
            engine = sa.create_engine(stack.database_url, pool_pre_ping=True)  # it lives through the restart
            timings = {"setup": time.monotonic() - began}
            intake = IntakeProgress(total=config.notifications)
            chaos_started = intake.began
            controller = Controller(stack, controller_rng, kills=config.kills, intake=intake,
                                    deadline=began + budget_s - TEARDOWN_RESERVE_S - 120, started=chaos_started)
            sampler = Sampler(stack)
            controller.start()
            sampler.start()
            _hand_over(stack, engine, planned, intake, deadline=began + budget_s - TEARDOWN_RESERVE_S - 120)
            intake.finish()
            timings["intake"] = time.monotonic() - chaos_started
            say(f"handed over {config.notifications} notifications in {timings['intake']:.0f} s "
                f"({intake.rate_per_s() or 0:.1f} a second; {intake.retried} hand-overs retried); "
                f"kills so far {controller.log.total_kills}")
            controller.join(timeout=max(1.0, began + budget_s - TEARDOWN_RESERVE_S - time.monotonic()))
            controller.stop_requested.set()
            controller.join(timeout=30)
            timings["chaos"] = time.monotonic() - chaos_started
            say(f"chaos over after {timings['chaos']:.0f} s: {controller.log.total_kills} kills, "
                f"{controller.log.broker_restarts} {broker} restart, {controller.log.postgres_restarts} PostgreSQL "
                f"restart, {controller.log.pgbouncer_restarts} PgBouncer restart, {controller.log.lost_for_good} lost for good")

            settle_began = time.monotonic()
            rows, settled = _settle(stack, engine, controller, planned, deadline=began + budget_s - TEARDOWN_RESERVE_S,
                                    stall_s=max(STALL_S, config.deadline_s + STALL_S), say=say)
            timings["settle"] = time.monotonic() - settle_began
            sampler.stop_requested.set()
            sampler.join(timeout=30)
            pools_full = _pools_full(stack)

            messages = stack.sandbox.messages()
            stats = stack.sandbox.stats()
            logs = stack.group.logs()
            decision_lines = Counter(int(found.group(1)) for found in DECISION_LINE.finditer(logs))
            overwritten = [m["id"] for m in messages if m["status"] == "sent" and m.get("highest_status") == "delivered"]
            verdict = check(planned, rows, messages, decision_lines, updates_received(engine, overwritten))
            postgres_log = stack.postgres.log_text()
            private = private_data_in(logs + stack.sandbox.stderr_text() + _redis_logs(log_dir) + postgres_log)
            handoff = lost_node_handoff(log_dir, controller.log, broker)
            timings["total"] = time.monotonic() - began
            report = _counts(config, planned, controller, stats, rows, messages, logs, engine, verdict, timings,
                             intake, sampler.peaks)
            report["handoff"] = {"held": handoff.held, "taken_over_max_s": max(handoff.taken_over, default=None),
                                 "taken_over": len(handoff.taken_over), "gone_with_broker": handoff.gone_with_broker,
                                 "given_back_at_broker_loss": handoff.given_back_at_broker_loss,
                                 "never_taken": len(handoff.never_taken)}
            say(f"the node lost for good ({controller.log.lost_for_good}) held {handoff.held} tasks: "
                f"{len(handoff.taken_over)} taken by other workers within {max(handoff.taken_over, default=0)} s "
                f"(bound {LOST_NODE_BOUND_S:.0f} s), {handoff.gone_with_broker} gone with the broker's restart "
                f"(the sweeps redo them), {len(handoff.never_taken)} never taken; "
                f"{handoff.given_back_at_broker_loss} more it had taken were given back to the broker "
                f"when its connection dropped before")
            for line in _count_lines(report):
                say(line)
            for key in ("broker", "notifications", "kills", "broker_restarts", "postgres_restarts", "fallbacks",
                        "read_lag", "tries_exhausted", "crash_loop", "fallback_for_existing", "duplicates",
                        "unreported_overwritten", "reads_per_message",
                        "handed_per_s", "settled_per_s", "settled_per_s_95"):
                record_property(f"chaos_{broker}_{key}", report[key])
            for key, value in report["settle_s"].items():
                record_property(f"chaos_{broker}_settle_{key}_s", value)

            problems = []
            if controller.log.errors:
                problems.append(f"controller errors: {controller.log.errors}")
            if controller.log.total_kills < config.kills:
                problems.append(f"only {controller.log.total_kills} kills of {config.kills}")
            if controller.log.broker_restarts != 1:
                problems.append(f"the broker restarted {controller.log.broker_restarts} times, not once")
            if controller.log.postgres_restarts != 1:
                problems.append(f"PostgreSQL restarted {controller.log.postgres_restarts} times, not once")
            if config.pgbouncer and controller.log.pgbouncer_restarts != 1:
                problems.append(f"PgBouncer restarted {controller.log.pgbouncer_restarts} times, not once")
            if controller.kinds_missed():
                problems.append(f"no kill of {sorted(controller.kinds_missed())}")
            if controller.log.lost_for_good is None:
                problems.append("no send worker was lost for good")
            if not handoff.within_bound():
                problems.append(f"the lost node's tasks were not taken over within {LOST_NODE_BOUND_S:.0f} s: "
                                f"{sorted(handoff.taken_over)[-5:]} s, never taken {handoff.never_taken[:5]}")
            if not pools_full:
                problems.append("not every worker runs its full pool again after the kills")
            if settled != "settled":
                problems.append(f"the run did not settle: {settled}")
            if private:
                problems.append(f"private data in process output: {private}")
            if sampler.peaks.over_bound:
                problems.append(f"more send tasks in the broker than a task per waiting row allows: {sampler.peaks.over_bound}")
            per_event, _ = messages_by_event(messages)
            for rule, cases in sorted(verdict.violations.items()):
                problems.append(f"{rule}: {len(cases)} events, e.g.")
                for case in cases[:8]:
                    event_id = case.split(":", 1)[0]
                    problems.append(f"    {case} | {dump_event(rows.get(event_id), per_event.get(event_id, {}))}")
            report["problems"] = problems
            if problems or config.keep_logs:
                kept = config.keep_logs or REPO_ROOT / "var" / f"chaos-logs-{broker}-{config.seed}"
                shutil.copytree(log_dir, kept, dirs_exist_ok=True)
                suspects = sorted({case.split(":", 1)[0] for cases in verdict.violations.values() for case in cases})[:200]
                (kept / "store.json").write_text(json.dumps(store_dump(engine, suspects), default=str, indent=1))
                # the sandbox's side of the same events: IDs, inboxes, statuses, times (no content, no phone)
                (kept / "sandbox.json").write_text(json.dumps(
                    {event_id: {inbox: [{key: m.get(key) for key in ("id", "status", "created_at", "updated_at",
                                                                      "conversation_id", "external_error")}
                                        for m in found] for inbox, found in per_event.get(event_id, {}).items()}
                     for event_id in suspects}, default=str, indent=1))
                (kept / "timeline.txt").write_text("\n".join(controller.log.timeline))
                (kept / "postgres-server.txt").write_text(postgres_log)
                say(f"process logs kept in {kept}")
            if config.report_path is not None:
                _write_report(config, report)
                say(f"report written to {config.report_path}")
            assert not problems, f"chaos seed {config.seed} (replay with CHAOS_SEED={config.seed}):\n" + "\n".join(problems)
    finally:
        if engine is not None:
            engine.dispose()
        with capsys.disabled():
            sys.stdout.write("\n")


# --- phases ---------------------------------------------------------------------------------


def _hand_over(stack: Any, engine: sa.Engine, planned: list[Planned], intake: IntakeProgress, *,
               deadline: float) -> None:
    """Hand every notification over as fast as the dispatcher sends them: at most UNSENT_WINDOW
    handed over and not yet sent at once, so the rate is the one it sustains under fire. A failed
    hand-over (the store or the broker away for a moment) is handed over again, as a host would."""
    unsent, checked = 0, 0.0
    for plan in planned:
        while unsent >= UNSENT_WINDOW and time.monotonic() < deadline:
            if time.monotonic() - checked < 0.25:
                time.sleep(0.25)
            unsent, checked = _unsent(engine, unsent), time.monotonic()
        patience = time.monotonic() + HAND_OVER_PATIENCE_S
        while True:
            try:
                stack.dispatcher.notify(plan.request)
                break
            except Exception:
                intake.retried += 1
                if time.monotonic() > min(patience, deadline):
                    raise
                time.sleep(0.5)
        intake.handed += 1
        unsent += 1


def _unsent(engine: sa.Engine, previous: int) -> int:
    """Notifications handed over and not yet sent; the previous count while the store is away."""
    table = Notification.__table__
    try:
        with engine.connect() as connection:
            return int(connection.scalar(sa.select(sa.func.count()).select_from(table)
                                         .where(table.c.state.in_(("queued", "sending")))) or 0)
    except sa.exc.SQLAlchemyError:
        return previous


def _settle(stack: Any, engine: sa.Engine, controller: Controller, planned: list[Planned], *,
            deadline: float, stall_s: float, say: Any) -> tuple[dict[str, Any], str]:
    """Wait (bounded) until every notification is terminal or confirmed, every webhook delivery
    is processed, the sandbox has nothing left to deliver, no lost read report is left without
    its read-back (the sandbox's record is read only once the store is otherwise quiet), and
    nothing changes for a while.

    Returns the rows and "settled", "stuck" (nothing changed for stall_s although some are not
    terminal: no sweep will move them) or "out of time"."""
    last_signature: Any = None
    calm, last_change, last_report = 0, time.monotonic(), time.monotonic()
    rows: dict[str, Any] = {}
    while time.monotonic() < deadline:
        controller.supervise()
        rows = read_store(engine)
        # crash_loop rows wait for an operator, not for time: counted and failed by the checks, not awaited
        unsettled = [event for event, row in rows.items() if settled_state(row) is not None and not set_aside(row)]
        missing = len(planned) - len(rows)
        unprocessed = unprocessed_deliveries(engine)
        pending = stack.sandbox.health().get("pending_webhooks", 0)
        lagging = 0
        if not unsettled and not missing and not unprocessed and not pending:
            lagging = reads_not_followed(rows, stack.sandbox.messages(), engine)
        signature = (unprocessed, pending, lagging, tuple(sorted(
            (event, row.state, row.fallback_decision, tuple(sorted((n, a["state"]) for n, a in row.attempts.items())))
            for event, row in rows.items())))
        if signature != last_signature:
            last_change = time.monotonic()
        quiet = not unsettled and not missing and not unprocessed and not pending and not lagging
        calm = calm + 1 if quiet and signature == last_signature else 0
        last_signature = signature
        if calm >= 3:
            return rows, "settled"
        if time.monotonic() - last_change > stall_s and not unprocessed and not pending:
            say(f"{len(unsettled) + missing} notifications stuck, {lagging} read reports not followed: "
                f"nothing changed for {stall_s:.0f} s")
            return rows, "stuck"
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            states = Counter(settled_state(rows[event]) for event in unsettled[:2000])
            say(f"settling: {len(unsettled)} not yet terminal or confirmed {dict(states.most_common(4))}, "
                f"{unprocessed} deliveries unprocessed, {pending} webhooks pending, {lagging} read reports to follow")
        time.sleep(2.0)
    return rows, "out of time"


def _pools_full(stack: Any) -> bool:
    """Every worker and consumer killed during the run is running again with its whole pool."""
    wanted = stack.group.supervised()  # not the send worker lost for good
    # A worker whose event loop failed late in the run may wait a lease's length before it gives up
    # (workers/bounded_stop.py); then its supervisor starts it again, within 30 s.
    deadline = time.monotonic() + settings_of(stack.env).stale_after_s + 30
    while time.monotonic() < deadline:
        stack.group.ensure_running()
        if all(len(stack.group.pool_children(name)) >= count for name, count in wanted.items()):
            return True
        time.sleep(0.5)
    return False


def _redis_logs(log_dir: Path) -> str:
    return "\n".join(path.read_text(errors="replace") for path in sorted(log_dir.glob("redis-*.log")))


# --- counts and the report ------------------------------------------------------------------


def _counts(config: ChaosConfig, planned: list[Planned], controller: Controller, stats: dict[str, Any],
            rows: dict[str, Any], messages: list[dict[str, Any]], logs: str, engine: sa.Engine, verdict: Any,
            timings: dict[str, float], intake: IntakeProgress, peaks: Any) -> dict[str, Any]:
    chaos = controller.log
    faults_by_kind: Counter[str] = Counter()
    for kinds in stats.get("faults", {}).values():
        faults_by_kind.update(kinds)
    decisions = Counter((row.fallback_decision or "-") for row in rows.values())
    reasons = Counter(row.fallback_reason for row in rows.values() if row.fallback_reason)
    attempt_states = Counter(f"{number}:{attempt['state']}" for row in rows.values()
                             for number, attempt in row.attempts.items())
    kinds = error_kinds(rows)
    per_event, _ = messages_by_event(messages)
    duplicates = sum(max(0, len(found) - 1) for inboxes in per_event.values() for found in inboxes.values())
    settle_times = [value for value in (settle_s(row) for row in rows.values()) if value is not None]
    return {
        "seed": config.seed,
        "notifications": len(planned),
        "kinds": dict(Counter(plan.kind for plan in planned)),
        "contacts": len({plan.request["contact"]["identifier"] for plan in planned}),
        "kills": chaos.total_kills,
        "pool_kills": chaos.pool_kills,
        "worker_kills": chaos.worker_kills,
        "kills_by_target": dict(sorted(chaos.kills.items())),
        "worker_restarts": controller.stack.group.restarts,
        "broker": config.broker,
        "broker_restarts": chaos.broker_restarts,
        "broker_down_s": round(chaos.broker_down_s, 1),
        "broker_queued": chaos.broker_queued,
        "postgres_restarts": chaos.postgres_restarts,
        "postgres_down_s": round(chaos.postgres_down_s, 1),
        "pgbouncer": config.pgbouncer,
        "pgbouncer_restarts": chaos.pgbouncer_restarts,
        "pgbouncer_down_s": round(chaos.pgbouncer_down_s, 1),
        "lost_for_good": chaos.lost_for_good,
        "supervisor_restarts": dict(chaos.supervisor_restarts),
        "faults": dict(faults_by_kind),
        "faults_by_operation": stats.get("faults", {}),
        "calls": stats.get("calls", {}),
        "calls_per_notification": calls_per_notification(stats.get("calls", {}), len(planned)),
        "reads_per_message": reads_per_message(stats.get("calls", {}), messages),
        "webhooks": stats.get("webhooks", {}),
        "deliveries": dict(delivery_outcomes(engine).most_common()),
        "tasks": _task_results(logs),
        "task_errors": dict(Counter(f"{task.removeprefix('dispatcher.')}:{error}"
                                    for task, error in TASK_RAISED.findall(logs)).most_common()),
        "pool_replaced": len(POOL_PROCESS_REPLACED.findall(logs)),
        "fallbacks": decisions.get("fallback", 0),
        "decisions": dict(decisions),
        "reasons": dict(reasons.most_common()),
        "messages": {"platform": sum(1 for m in messages if m["inbox_id"] == 1),
                     "sms": sum(1 for m in messages if m["inbox_id"] == 2), "total": len(messages)},
        "notification_states": dict(Counter(row.state for row in rows.values()).most_common()),
        "attempt_states": dict(sorted(attempt_states.items())),
        "read_lag": len(verdict.read_lag),
        "unreported_overwritten": len(verdict.unknowable),
        "error_kinds": kinds,
        # notifications with an attempt that ended so (a crash_loop one is set aside, not ended)
        "tries_exhausted": kinds["attempts"].get("tries_exhausted", 0),
        "crash_loop": sum(1 for row in rows.values() if set_aside(row)),
        "fallback_for_existing": len(verdict.violations.get("no fallback for a message that exists", [])),
        "failed_without_message": len(verdict.violations.get(
            "no notification failed without a message but by the workspace", [])),
        "duplicates": duplicates,
        "settle_s": percentiles(settle_times),
        "settled_timed": len(settle_times),
        "violations": {rule: len(cases) for rule, cases in verdict.violations.items()},
        "intake_retries": intake.retried,
        "handed_per_s": round(intake.rate_per_s() or 0.0, 2),
        **_settled_rates(rows),
        "peaks": {"queue_depth": peaks.queue_depth, "queue_depth_at": peaks.queue_depth_at,
                  "worker_rss_mb": peaks.worker_rss_mb, "total_rss_mb": peaks.total_rss_mb,
                  "db_connections": peaks.db_connections, "db_active": peaks.db_active,
                  "samples": peaks.samples},
        # issue 44: a task per waiting row, not one more every stale_after_s
        "send_tasks": {"peak": peaks.send_tasks, "backlog_then": peaks.backlog_then, "peak_backlog": peaks.backlog,
                       "peak_ratio": peaks.send_ratio, "over_bound": peaks.over_bound},
        "timings": {name: round(value) for name, value in timings.items()},
        "timeline": chaos.timeline,
    }


def _settled_rates(rows: dict[str, Any]) -> dict[str, float]:
    """Notifications settled a second, from the first hand-over: to the last one settled, and to
    the moment 95 % of them had (the silent recipients' deadline holds the last ones back)."""
    handed = [row.created_at for row in rows.values() if row.created_at is not None]
    settled = sorted(row.created_at.timestamp() + seconds for row in rows.values()
                     if (seconds := settle_s(row)) is not None)
    if not handed or not settled:
        return {"settled_per_s": 0.0, "settled_per_s_95": 0.0}
    first = min(handed).timestamp()
    ninety_five = settled[max(0, int(len(settled) * 0.95) - 1)]
    return {"settled_per_s": round(len(settled) / max(settled[-1] - first, 1e-9), 2),
            "settled_per_s_95": round(int(len(settled) * 0.95) / max(ninety_five - first, 1e-9), 2)}


def _task_results(logs: str) -> dict[str, int]:
    """Send and outcome task results by word; the sweep's results (rows published) summed."""
    results: Counter[str] = Counter()
    for task, result in TASK_RESULT.findall(logs):
        if task == "dispatcher.sweep":
            results["sweep:published"] += int(result) if result.isdigit() else 0
            results["sweep:runs"] += 1
        else:
            results[f"{task.removeprefix('dispatcher.')}:{result}"] += 1
    return dict(results.most_common())


def _count_lines(report: dict[str, Any]) -> list[str]:
    hooks = report["webhooks"]
    return [
        f"notifications {report['notifications']} {report['kinds']} for {report['contacts']} contacts",
        f"kills {report['kills']}: pool processes {report['pool_kills']}, whole workers {report['worker_kills']} "
        f"{report['kills_by_target']}",
        f"restarts: workers by the supervisor {report['worker_restarts']}, pool processes by their worker "
        f"{report['pool_replaced']}, beat/receiver by the supervisor {report['supervisor_restarts'] or 0}; "
        f"lost for good: {report['lost_for_good']}",
        f"{report['broker']} restarted {report['broker_restarts']} (down {report['broker_down_s']} s, holding "
        f"{report['broker_queued']}{' lost with it' if report['broker'] == 'redis' else ', kept'}), "
        f"PostgreSQL restarted {report['postgres_restarts']} (down {report['postgres_down_s']} s)"
        + (f"; the store through PgBouncer (transaction mode), which was killed and started again "
           f"{report['pgbouncer_restarts']} (down {report['pgbouncer_down_s']} s)" if report["pgbouncer"] else ""),
        f"faults drawn by the sandbox {report['faults']}",
        f"faults by operation {report['faults_by_operation']}",
        f"API calls {report['calls']}",
        f"API calls per notification {report['calls_per_notification']}; listMessages a message "
        f"{report['reads_per_message']}; wrong fallbacks (for a message that reached delivered) "
        f"{report['fallback_for_existing']}",
        f"webhooks: events {hooks.get('events', 0)}, duplicated {hooks.get('duplicated', 0)}, "
        f"reordered {hooks.get('reordered', 0)}, dropped {hooks.get('dropped', 0)}, delivered {hooks.get('delivered', 0)}, "
        f"retries {hooks.get('retries', 0)}, gave up {hooks.get('gave_up', 0)}",
        f"webhook deliveries by outcome {report['deliveries']}",
        f"task results {report['tasks']}; raised {report['task_errors']}",
        f"fallback decisions {report['decisions']} {report['reasons']}",
        f"messages in the sandbox {report['messages']}",
        f"final notification states {report['notification_states']}; attempts {report['attempt_states']}",
        f"delivered here but read in the sandbox (read report lost): {report['read_lag']}",
        f"delivered, overwritten by a late sent, and no two reports of it received (lost on the way: the receiver down, or dropped): "
        f"{report['unreported_overwritten']} (counted apart: nothing the dispatcher was told could show it)",
        f"error kinds: notifications {report['error_kinds']['notifications'] or '{}'}, "
        f"attempts {report['error_kinds']['attempts'] or '{}'}",
        f"issue 22 ({report['broker']}): tries_exhausted {report['tries_exhausted']}, crash_loop {report['crash_loop']}, "
        f"failed without a message (ours) {report['failed_without_message']}, duplicates {report['duplicates']}, "
        f"fallbacks for a message that exists {report['fallback_for_existing']}",
        f"settle time from hand-over to terminal or confirmed ({report['settled_timed']} notifications): "
        f"{report['settle_s']} s",
        f"rates: handed over {report['handed_per_s']} a second (at most {UNSENT_WINDOW} unsent at once), settled "
        f"{report['settled_per_s']} a second to the last one, {report['settled_per_s_95']} a second to 95 %",
        f"peaks: queue depth {report['peaks']['queue_depth']} {report['peaks']['queue_depth_at']}, resident memory "
        f"by kind (a worker with its pool) {report['peaks']['worker_rss_mb']} MB, all together "
        f"{report['peaks']['total_rss_mb']} MB, store connections {report['peaks']['db_connections']} "
        f"({report['peaks']['db_active']} active) over {report['peaks']['samples']} samples",
        f"send tasks in the broker (waiting or held): peak {report['send_tasks']['peak']} for a backlog of "
        f"{report['send_tasks']['backlog_then']} (bound: backlog + {sum(SENDERS.values())} pool processes x prefetch 1, "
        f"+10 %), peak backlog {report['send_tasks']['peak_backlog']}, peak tasks / backlog "
        f"{report['send_tasks']['peak_ratio']} (backlogs of {RATIO_FLOOR} or more); past the bound "
        f"{len(report['send_tasks']['over_bound'])} samples",
        f"the node lost for good: {report.get('handoff', {})}",
        f"violations {report['violations'] or 'none'}",
        f"runtime {report['timings']} s",
    ]


def _write_report(config: ChaosConfig, report: dict[str, Any]) -> None:
    assert config.report_path is not None
    config.report_path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# Chaos run, seed {report['seed']}",
        "",
        f"Replay: `scripts/chaos --broker {config.broker} --seed {report['seed']} "
        f"--notifications {config.notifications} --kills {config.kills}{' --pgbouncer' if config.pgbouncer else ''}`",
        "",
        f"**Result: {'PASSED' if not report.get('problems') else 'FAILED'}**",
        "",
        "## Counts",
        "",
    ]
    lines += [f"- {line}" for line in _count_lines(report)]
    if report.get("problems"):
        lines += ["", "## Problems", "", "```", *report["problems"], "```"]
    lines += ["", "## Timeline of the controller", "", "```", *report["timeline"], "```", ""]
    config.report_path.write_text("\n".join(lines), encoding="utf-8")
