"""The alert rules of deploy/prometheus/alerts.yml fire through a real Prometheus: it scrapes the
receiver and a send worker started here (real processes over Redis and PostgreSQL, the sandbox as
the workspace), evaluates the shipped rules, and its own API (``/api/v1/alerts``) is asked what
fires.

Each test sets every rule's ``for:`` (1 to 10 minutes in the shipped file) to 2 s in a temporary
copy: waiting minutes would make each test minutes long, and what ``for:`` does is shown by
promtool's unit tests (deploy/prometheus/alerts_test.yml, test_prometheus_rules.py). The
expressions are the shipped ones, unchanged; Prometheus scrapes and evaluates every second, where a
deployment does so every 15 s (deploy/prometheus/prometheus.yml), for the same reason.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.service import Dispatcher
from dispatcher.store.migrate import upgrade_database
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.ports import listens
from tests.support.prometheus_server import Alert, PrometheusProcess, rules_with_short_for, running_prometheus
from tests.support.sandbox_process import SandboxProcess, free_port, running_sandbox
from tests.support.worker_process import ProcessGroup, dispatcher_environment, fresh_broker_url, process_group, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RULES = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
SHORT_FOR = "2s"
WORKERS, RECEIVER = "dispatcher-workers", "dispatcher-receiver"  # the job names the rules and the example use


@dataclass
class Stack:
    group: ProcessGroup
    prometheus: PrometheusProcess
    sandbox: SandboxProcess
    dispatcher: Dispatcher

    def alerts(self, name: str) -> list[Alert]:
        return [alert for alert in self.prometheus.alerts() if alert.name == name]

    def scraped_up(self, job: str) -> bool:
        return any(sample["value"][1] == "1" for sample in self.prometheus.query(f'up{{job="{job}"}}'))


@pytest.fixture()
def stack(fresh_postgres_url: str, redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Iterator[Stack]:
    """The sandbox, a receiver, one send worker (2 pool processes) serving metrics, and Prometheus
    scraping both with the shipped rules (``for:`` shortened)."""
    upgrade_database(fresh_postgres_url)
    worker_port, receiver_port = free_port(), free_port()
    with running_sandbox() as sandbox:
        broker_url = fresh_broker_url(redis_url)
        env = dispatcher_environment(api_url=sandbox.base_url, database_url=fresh_postgres_url, broker_url=broker_url,
                                     DISPATCHER_METRICS_PORT=str(worker_port),
                                     DISPATCHER_WEBHOOK_SECRETS=secrets.token_urlsafe(32))
        settings = example_settings(api_url=sandbox.base_url, database_url=fresh_postgres_url, broker_url=broker_url)
        rules = rules_with_short_for(RULES, tmp_path, for_=SHORT_FOR)
        with process_group(env, tmp_path) as group:
            receiver = group.start("receiver", ["-m", "dispatcher", "receiver", "--host", "127.0.0.1",
                                                "--port", str(receiver_port)])
            group.start("worker", ["-m", "dispatcher", "worker", "--concurrency", "2", "--without-gossip",
                                   "--without-mingle"])
            wait_until(lambda: _answers(f"http://127.0.0.1:{receiver_port}/healthz") and listens(receiver.pid, receiver_port),
                       timeout_s=30, what="the receiver")
            jobs = {WORKERS: [f"127.0.0.1:{worker_port}"], RECEIVER: [f"127.0.0.1:{receiver_port}"]}
            with running_prometheus(jobs, rule_files=[rules], folder=tmp_path) as prometheus:
                stack = Stack(group, prometheus, sandbox, Dispatcher(settings, enqueuer=CeleryEnqueuer(broker_url)))
                wait_until(lambda: stack.scraped_up(WORKERS) and stack.scraped_up(RECEIVER), timeout_s=60,
                           what="Prometheus scraping the worker and the receiver")
                yield stack


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _poll(condition: Callable[[], bool], *, timeout_s: float) -> None:
    """Poll until ``condition()`` holds or the deadline passes; the caller asserts the state after."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not condition():
        time.sleep(0.5)


def test_a_revoked_token_opens_the_breaker_and_its_alert_fires(stack: Stack) -> None:
    # Given the workspace answering and no breaker open: each process reports the default workspace closed
    # (an empty reason is no label at all in Prometheus)
    closed = stack.prometheus.query("max by (workspace, reason) (dispatcher_workspace_paused)")
    assert [(sample["metric"], sample["value"][1]) for sample in closed] == [({"workspace": "default"}, "0")]
    assert stack.alerts("DispatcherWorkspacePaused") == []
    # When the workspace's admin revokes the token and a notification is handed over
    stack.sandbox.revoke_token()
    stack.dispatcher.notify(reminder("prom-breaker-1", identifier="prom-b1", phone="+15550490001"))
    # Then the worker meets the 401, the breaker opens for every worker, and Prometheus fires the alert
    _poll(lambda: any(alert.state == "firing" for alert in stack.alerts("DispatcherWorkspacePaused")), timeout_s=60)
    fired = stack.alerts("DispatcherWorkspacePaused")
    assert [(alert.state, alert.labels["workspace"], alert.labels["reason"]) for alert in fired] == [
        ("firing", "default", "auth")], stack.prometheus.log()[-2000:]
    # the notification waits for the workspace, it does not fail
    assert stack.dispatcher.status("prom-breaker-1").state in ("queued", "sending")
    logs = stack.group.logs() + stack.prometheus.log()
    assert stack.sandbox.token not in logs and "+15550490001" not in logs


def test_killing_the_only_worker_fires_the_no_worker_alert(stack: Stack) -> None:
    # Given the worker scraped and the alert quiet (absent() fires while nothing was scraped yet)
    _poll(lambda: stack.alerts("DispatcherNoSendWorker") == [], timeout_s=30)
    assert stack.alerts("DispatcherNoSendWorker") == []
    # When the only send worker is killed (its pool with it)
    stack.group.stop("worker", kill=True)
    # Then Prometheus sees no worker answer and fires the alert
    _poll(lambda: any(alert.state == "firing" for alert in stack.alerts("DispatcherNoSendWorker")), timeout_s=60)
    assert [alert.state for alert in stack.alerts("DispatcherNoSendWorker")] == ["firing"], stack.prometheus.log()[-2000:]
    assert not stack.scraped_up(WORKERS)
    # the receiver still answers its scrapes (a loaded machine may miss one: polled): it is not a send worker
    _poll(lambda: stack.scraped_up(RECEIVER), timeout_s=20)
    assert stack.scraped_up(RECEIVER)
    assert [alert.state for alert in stack.alerts("DispatcherNoSendWorker")] == ["firing"]
