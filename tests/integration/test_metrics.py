"""The workers' Prometheus endpoint, summed over the prefork children, with real sends."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.service import Dispatcher
from dispatcher.store.migrate import upgrade_database
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.sandbox_process import free_port, running_sandbox
from tests.support.worker_process import dispatcher_environment, fresh_broker_url, process_group, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _value(text: str, metric: str) -> float:
    match = re.search(rf"^{re.escape(metric)} ([0-9.e+]+)$", text, flags=re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_worker_metrics_count_sends_latency_and_states(
    fresh_postgres_url: str, redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    upgrade_database(fresh_postgres_url)
    port = free_port()
    with running_sandbox() as sandbox:
        broker_url = fresh_broker_url(redis_url)
        env = dispatcher_environment(api_url=sandbox.base_url, database_url=fresh_postgres_url, broker_url=broker_url,
                                     DISPATCHER_METRICS_PORT=str(port))
        settings = example_settings(api_url=sandbox.base_url, database_url=fresh_postgres_url, broker_url=broker_url)
        dispatcher = Dispatcher(settings, enqueuer=CeleryEnqueuer(broker_url))
        with process_group(env, tmp_path) as group:
            group.start("worker", ["-m", "dispatcher", "worker", "--concurrency", "2", "--without-gossip", "--without-mingle"])
            events = [f"metrics-{n}" for n in range(5)]
            for n, event_id in enumerate(events):
                dispatcher.notify(reminder(event_id, identifier=f"metrics-p{n}", phone=f"+1555060{n:04d}"))
            wait_until(lambda: all(dispatcher.status(e).message_id is not None for e in events), timeout_s=60, what="sends")

            def scraped() -> str:
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                except httpx.TransportError:
                    return ""

            wait_until(lambda: _value(scraped(), 'dispatcher_send_results_total{result="accepted"}') >= 5,
                       timeout_s=30, what="the accepted sends in the metrics")
            text = scraped()
    assert _value(text, "dispatcher_send_latency_seconds_count") >= 5
    gauge = r'^dispatcher_notifications\{state="(\w+)"\} ([0-9.]+)$'
    states = {state: float(count) for state, count in re.findall(gauge, text, re.MULTILINE)}
    assert sum(states.values()) == 5, states
    assert "+1555060" not in text and "Reminder" not in text
