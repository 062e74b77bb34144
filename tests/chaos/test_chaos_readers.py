"""The chaos run's readers, on made-up logs and rows: what the full run's verdicts rest on must be
right on its own (issue 20: the lost node's hand-over bound, lost read reports, the kill pace)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

from chaos_harness import (
    DEADLINE_REASON,
    LOST_NODE_BOUND_S,
    ChaosLog,
    Controller,
    IntakeProgress,
    Peaks,
    Planned,
    Row,
    calls_per_notification,
    check,
    lost_node_handoff,
    reads_not_followed,
    reads_per_message,
    send_task_bound,
)

LOSS = time.mktime(time.strptime("2026-11-27 10:00:00", "%Y-%m-%d %H:%M:%S"))


def line(seconds: float, task_id: str, what: str, process: str = "MainProcess") -> str:
    moment = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(LOSS + seconds)) + f",{int(seconds * 1000) % 1000:03d}"
    task = f"Task dispatcher.send[{task_id}]"
    return {"received": f"[{moment}: INFO/{process}] {task} received",
            "succeeded": f"[{moment}: INFO/ForkPoolWorker-1] {task} succeeded in 0.5s: 'accepted'",
            "retry": f"[{moment}: INFO/ForkPoolWorker-1] {task} retry: Retry in 1.0s",
            "connection lost": f"[{moment}: WARNING/MainProcess] consumer: Connection to broker lost. "
                               "Trying to re-establish the connection..."}[what]


def write(path: Path, *lines: str) -> None:
    path.write_text("\n".join(lines) + "\n")


def test_the_lost_workers_unfinished_tasks_are_timed_until_another_worker_takes_them(tmp_path: Path) -> None:
    write(tmp_path / "sender0-2.log", line(-50, "aaaa", "received"))  # an earlier life: not held at the loss
    write(tmp_path / "sender0-7.log",
          line(-9, "bbbb", "received"), line(-8, "bbbb", "succeeded"),  # finished there
          line(-7, "cccc", "received"), line(-6, "cccc", "retry"),  # handed back by its retry
          line(-5, "dddd", "received"),  # held: taken over 31 s after the loss
          line(-4, "eeee", "received"),  # held: taken over too late
          line(-3, "ffff", "received"))  # held: its pool process died before, another took it before the loss
    write(tmp_path / "sender1-3.log",
          line(-2, "ffff", "received"), line(31, "dddd", "received"), line(LOST_NODE_BOUND_S + 5, "eeee", "received"))
    log = ChaosLog(lost_for_good="sender0", lost_at=LOSS)

    handoff = lost_node_handoff(tmp_path, log, "rabbitmq")

    assert handoff.held == 2
    assert sorted(handoff.taken_over) == [31.0, LOST_NODE_BOUND_S + 5]
    assert not handoff.within_bound()


def test_a_task_no_one_took_is_gone_with_redis_only_when_redis_restarted_after_it_was_taken(tmp_path: Path) -> None:
    write(tmp_path / "sender2-4.log", line(-5, "aaaa", "received"))
    write(tmp_path / "consumer0-1.log", "")
    restarted_after = ChaosLog(lost_for_good="sender2", lost_at=LOSS, broker_restarted_at=LOSS + 10)
    restarted_before = ChaosLog(lost_for_good="sender2", lost_at=LOSS, broker_restarted_at=LOSS - 60)

    kept = lost_node_handoff(tmp_path, restarted_after, "redis")
    missing = lost_node_handoff(tmp_path, restarted_before, "redis")
    on_rabbitmq = lost_node_handoff(tmp_path, restarted_after, "rabbitmq")

    assert (kept.gone_with_broker, kept.never_taken, kept.within_bound()) == (1, [], True)
    assert (missing.never_taken, missing.within_bound()) == (["aaaa"], False)
    assert on_rabbitmq.never_taken == ["aaaa"]  # RabbitMQ keeps what it held: nothing may vanish


def test_a_delivered_attempt_whose_message_the_sandbox_says_is_read_is_a_read_not_followed() -> None:
    row = Row(1, "chaos-00001", "delivered", 11, "delivered", None, None, None, None, None)
    row.attempts[1] = {"state": "delivered", "message_id": 11}
    read = Row(2, "chaos-00002", "read", 12, "read", None, None, None, None, None)
    read.attempts[1] = {"state": "read", "message_id": 12}
    rows = {row.event_id: row, read.event_id: read}

    assert reads_not_followed(rows, [{"id": 11, "status": "read"}, {"id": 12, "status": "read"}]) == 1
    assert reads_not_followed(rows, [{"id": 11, "status": "delivered"}, {"id": 12, "status": "read"}]) == 0


def test_kills_spread_over_the_hand_over_still_to_come_at_the_measured_rate() -> None:
    intake = IntakeProgress(total=1000, handed=500, began=time.monotonic() - 100)  # 5 a second so far
    controller = Controller.__new__(Controller)  # only the pace is under test: no stack, no thread
    controller.intake, controller.target, controller.log = intake, 60, ChaosLog(pool_kills=10)

    assert 1.9 < controller.mean_gap_s() < 2.1  # 500 left at 5 a second: 100 s for 50 kills

    intake.done = threading.Event()
    intake.finish()
    assert controller.mean_gap_s() == 1.0  # past the hand-over, one a second


def test_a_task_taken_before_the_lost_workers_broker_connection_dropped_was_the_brokers_again(tmp_path: Path) -> None:
    """Issue 20's CI run: a send task taken just before RabbitMQ's crash, not yet on the node's
    disk, came back to no one. The worker had forgotten it when its connection dropped, so it did
    not hold it when it was lost; what the broker owed is judged by checks 1-6 (and, since, kept
    by publisher confirms: tests/integration/test_rabbitmq_node.py)."""
    write(tmp_path / "sender2-4.log",
          line(-30, "aaaa", "received"),  # taken, then the connection dropped: the broker's again
          line(-20, "", "connection lost"),
          line(-5, "bbbb", "received"))  # taken on the new connection: held at the loss
    write(tmp_path / "sender0-1.log", "")
    log = ChaosLog(lost_for_good="sender2", lost_at=LOSS)

    handoff = lost_node_handoff(tmp_path, log, "rabbitmq")

    assert (handoff.given_back_at_broker_loss, handoff.held, handoff.never_taken) == (1, 1, ["bbbb"])
    assert not handoff.within_bound()  # what it held when it was lost must still come back


def _overwritten(event_id: str, row_id: int, *, attempt: str, decision: str | None) -> tuple[Planned, Row]:
    plan = Planned(event_id, "overwritten", {"contact": {"identifier": f"p-{row_id}"}})
    current_message = 200 + row_id if decision == "fallback" else 100 + row_id
    row = Row(row_id, event_id, "delivered", current_message, attempt, decision,
              DEADLINE_REASON if decision else None, None, None, None)
    row.attempts[1] = {"state": attempt, "message_id": 100 + row_id, "error_kind": None}
    if decision == "fallback":
        row.attempts[2] = {"state": "delivered", "message_id": 200 + row_id, "error_kind": None}
    return plan, row


def test_a_message_a_late_sent_overwrote_must_end_delivered_and_never_fall_back() -> None:
    # the workspace says sent for both first messages; each reached delivered (issue 44)
    right = _overwritten("chaos-00001", 1, attempt="delivered", decision=None)
    wrong = _overwritten("chaos-00002", 2, attempt="sent", decision="fallback")
    messages = [{"id": 101, "inbox_id": 1, "status": "sent", "highest_status": "delivered",
                 "content": "Reminder chaos-00001: your appointment"},
                {"id": 102, "inbox_id": 1, "status": "sent", "highest_status": "delivered",
                 "content": "Reminder chaos-00002: your appointment"},
                {"id": 202, "inbox_id": 2, "status": "delivered", "highest_status": "delivered",
                 "content": "Reminder chaos-00002: your appointment"}]
    verdict = check([right[0], wrong[0]], {"chaos-00001": right[1], "chaos-00002": wrong[1]}, messages, Counter())

    flagged = {rule: [entry.split(":")[0] for entry in entries] for rule, entries in verdict.violations.items()}
    assert flagged["no fallback for a message that exists"] == ["chaos-00002"]  # a wrong fallback: a second message
    assert flagged["the expected outcome (overwritten)"] == ["chaos-00002"]
    assert all("chaos-00001" not in entries for entries in flagged.values())  # delivered here, sent there: right
    assert calls_per_notification({"listMessages": 3, "createMessage": 3}, 2) == {"createMessage": 1.5,
                                                                                  "listMessages": 1.5}
    assert reads_per_message({"listMessages": 3}, messages) == 1.0

    # and when no two reports of the second one ever reached the dispatcher (its receiver was down),
    # nothing it was told could show the delivery: counted apart, not excused where they did arrive
    unreported = check([right[0], wrong[0]], {"chaos-00001": right[1], "chaos-00002": wrong[1]}, messages, Counter(),
                       {101: 3, 102: 1})
    assert unreported.unknowable == ["chaos-00002"] and not unreported.violations


def test_the_send_task_bound_is_a_task_per_waiting_row_plus_the_senders_prefetch_plus_a_tenth() -> None:
    # three send workers of three pool processes, a task each: 9 held beyond the backlog
    assert send_task_bound(0) == 10 and send_task_bound(100) == 120
    peaks = Peaks()
    peaks.note_send_tasks(105, 100)  # a task per row and a few held: within
    peaks.note_send_tasks(3, 2)  # 1.5 a row, but too small a backlog to say
    assert (peaks.send_tasks, peaks.backlog_then, peaks.send_ratio, peaks.over_bound) == (105, 100, 1.05, [])
    peaks.note_send_tasks(300, 100)  # a second task for most rows (the stale sweep of before issue 44)
    assert peaks.send_ratio == 3.0 and peaks.over_bound == ["sample 0: 300 send tasks for a backlog of 100 (bound 120)"]
