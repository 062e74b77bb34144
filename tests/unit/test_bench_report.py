"""scripts/bench/report.py's verdicts for the capacity, end-to-end and other-broker figures: a
figure is "met" only when every condition of its target holds (the report is how a missed target
shows; a wrong verdict would hide one)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

from tests.conftest import REPO_ROOT


def load_report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_report", REPO_ROOT / "scripts" / "bench" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_report", module)
    spec.loader.exec_module(module)
    return module


report = load_report()


def ran(result: dict[str, Any]) -> dict[str, Any]:
    return {"command": "x", "status": "ok", "result": result}


def latency_result(*, achieved: float, sustained: float, p99_ms: float, refused: int = 0, twice: int = 0,
                   missing: int = 0) -> dict[str, Any]:
    side = {"achieved_rate": achieved, "handed_over": 100, "p50_ms": p99_ms / 2, "p90_ms": p99_ms, "p99_ms": p99_ms,
            "max_ms": p99_ms, "intake_threads": 4}
    return {"rate_per_s": achieved, "capacity_per_s": sustained, "seconds": 20, "ratio_p50": 1.0, "ratio_p99": 1.0,
            "baseline": dict(side),
            "ours": {**side, "sustained_per_s": sustained, "all_accepted": missing == 0, "accepted": 100 - missing,
                     "refused": refused, "events_with_two_messages": twice, "events_without_message": missing,
                     "cpu_ms_per_notification": {}}}


def verdicts(benchmarks: dict[str, Any]) -> dict[Any, list[bool | None]]:
    found: dict[Any, list[bool | None]] = {}
    for row in report.rows({"benchmarks": benchmarks}):
        found.setdefault(row["n"], []).append(row["met"])
    return found


def test_past_capacity_is_met_only_at_twice_the_sustained_rate_with_nothing_lost_refused_or_doubled() -> None:
    assert verdicts({"overload": ran(latency_result(achieved=200, sustained=100, p99_ms=9000))})["5b"] == [True]
    for short in (latency_result(achieved=150, sustained=100, p99_ms=9000),  # not twice the capacity
                  latency_result(achieved=200, sustained=100, p99_ms=9000, refused=1),
                  latency_result(achieved=200, sustained=100, p99_ms=9000, twice=1),
                  latency_result(achieved=200, sustained=100, p99_ms=9000, missing=1)):
        assert verdicts({"overload": ran(short)})["5b"] == [False]


def test_eighty_percent_latency_is_held_to_a_p99_of_50_ms() -> None:
    assert verdicts({"latency_80": ran(latency_result(achieved=80, sustained=100, p99_ms=49.0))})["5c"] == [True]
    assert verdicts({"latency_80": ran(latency_result(achieved=80, sustained=100, p99_ms=51.0))})["5c"] == [False]


def test_the_other_broker_is_compared_with_the_same_figure_of_the_run() -> None:
    redis = {"broker": "redis", "sends_per_s": 150.0, "noop_tasks_per_s": 600.0, "ratio": 0.25}
    close = {**redis, "broker": "rabbitmq", "sends_per_s": 121.0}
    far = {**redis, "broker": "rabbitmq", "sends_per_s": 119.0}
    assert verdicts({"send_path": ran(redis), "send_path_other_broker": ran(close)})[12] == [True]
    assert verdicts({"send_path": ran(redis), "send_path_other_broker": ran(far)})[12] == [False]
    # without the run it is compared with, there is no verdict at all (not a "met")
    assert 12 not in verdicts({"send_path_other_broker": ran(close)})


def test_the_reads_share_line_names_the_share_its_counts_and_the_budget_and_is_left_out_without_them() -> None:
    grants = {"by_bucket": {"account": 768, "reads": 168}, "reads_share": 0.219, "most_reads_in_a_minute": 120,
              "most_grants_in_a_minute": 600, "api_requests_per_minute": 600, "reads_fraction_of_api_requests": 0.2}
    [line, blank] = report._reads_share_line(grants)
    assert "0.219" in line and "168 of 768" in line and "at most 120 in any 60 s" in line and "600 a minute" in line
    assert blank == ""
    assert report._reads_share_line(None) == []  # a result from before the count
    assert report._reads_share_line({**grants, "reads_share": None}) == []  # nothing granted


def tracking_phase(*, reads_per_message: float, target: float, wrong: int = 0) -> dict[str, Any]:
    return {"notifications": 10, "settled": True, "settled_after_s": 2.0, "window_s": 70.0,
            "calls": {"createMessage": 11, "listMessages": 1}, "list_inboxes": 0,
            "calls_per_notification_by_operation": {"createMessage": 1.1, "listMessages": 0.1},
            "calls_per_notification": 1.2, "faults_fired": {}, "sandbox_webhooks": {"events": 42},
            "outgoing_messages": 11, "list_messages": 1, "list_messages_per_message": reads_per_message,
            "status_reads": 1, "status_reads_per_message": 0.09,
            "limiter_grants": {"by_bucket": {"account": 12, "reads": 1}, "reads_share": 0.083},
            "baseline": {"message_updated": 31, "reads_per_message": 2.82}, "ratio_to_baseline": 0.032,
            "states": {"read": 8, "delivered": 2}, "fallbacks": 1, "by_kind": {"reads": {"read": 8}},
            "unexpected_outcomes": [], "wrong_fallbacks": wrong, "target_list_messages_per_message": target,
            "met": reads_per_message <= target and wrong == 0}


def tracking_result(**variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"notifications_per_phase": 10, "concurrency": 2,
            "mix": {"reads": {"phone_prefix": "+1555033", "what": "read", "contacts": 10}},
            "settings": {"api_requests_per_minute": 2400, "contact_searches_per_minute": 90,
                         "reads_fraction_of_api_requests": 0.2, "reconcile_after_s": 60.0, "sweep_interval_s": 5.0},
            "sandbox": "stock", "window": {"min_s": 70.0, "max_s": 300.0, "rule": "at least 70 s"},
            "variants": {name: {"phases": phases} for name, phases in variants.items()}}


def test_tracking_reads_are_met_per_variant_only_when_every_phase_is_within_its_target_with_no_wrong_fallback() -> None:
    good = {"new": tracking_phase(reads_per_message=0.1, target=1.0), "known": tracking_phase(reads_per_message=0.1, target=1.0)}
    over = {**good, "known": tracking_phase(reads_per_message=1.1, target=1.0)}
    wrong = {**good, "new": tracking_phase(reads_per_message=0.1, target=1.0, wrong=1)}
    faults = {"new": tracking_phase(reads_per_message=1.1, target=1.2), "known": tracking_phase(reads_per_message=0.2, target=1.2)}
    assert verdicts({"tracking_calls": ran(tracking_result(plain=good, faults=faults))})[13] == [True, True]
    assert verdicts({"tracking_calls": ran(tracking_result(plain=over))})[13] == [False]
    assert verdicts({"tracking_calls": ran(tracking_result(plain=wrong))})[13] == [False]
    tables = "\n".join(report.tracking_tables(tracking_result(plain=good, faults=faults)))
    assert "| no fault, new |" in tables and "| chaos faults, known |" in tables and "**1.20**" in tables
