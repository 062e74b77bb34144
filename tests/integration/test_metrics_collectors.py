"""What the metrics read at scrape time besides the notifications' states: each workspace's
circuit breaker from the Redis the workers share, the callback URLs paused in the store, the
routes' delivery deadlines from the configuration."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from dispatcher.metrics import NotificationStates, RouteDeadlines, WorkspaceBreakers, deployment_collectors, render
from dispatcher.policy.breaker import BreakerPlan, RedisBreaker
from dispatcher.store import callbacks as outbox
from dispatcher.store.db import session_factory, shared_engine
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import utcnow
from tests.support.dispatcher_setup import example_settings
from tests.support.sandbox_process import free_port

pytestmark = pytest.mark.integration


def _samples(text: str, metric: str) -> dict[str, float]:
    """The samples of ``metric`` by their label text (``workspace="default",reason=""``)."""
    return {labels: float(value) for labels, value in
            re.findall(rf"^{re.escape(metric)}\{{([^}}]*)\}} ([0-9.e+-]+)$", text, re.MULTILINE)}


@pytest.fixture()
def breaker(redis_url: str) -> Iterator[RedisBreaker]:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    prefix = f"test:{uuid.uuid4().hex}:"
    yield RedisBreaker(client, BreakerPlan(base_s=30, cap_s=60), key_prefix=prefix)
    client.delete(prefix + "breaker", prefix + "breaker:probe")
    client.close()


def test_the_breaker_reads_1_with_its_reason_while_open_and_0_once_closed(breaker: RedisBreaker) -> None:
    collector = WorkspaceBreakers({"default": breaker})
    assert _samples(render(collector).decode(), "dispatcher_workspace_paused") == {'reason="",workspace="default"': 0.0}
    breaker.trip("auth", "the workspace refused the API token (HTTP 401): check DISPATCHER_API_TOKEN")
    assert _samples(render(collector).decode(), "dispatcher_workspace_paused") == {
        'reason="auth",workspace="default"': 1.0}
    assert breaker.gate() is not None  # the scrape took no probe: the pause holds for the workers
    breaker.close()
    assert _samples(render(collector).decode(), "dispatcher_workspace_paused") == {'reason="",workspace="default"': 0.0}


def test_a_breaker_that_does_not_answer_gives_no_sample_rather_than_a_reassuring_0() -> None:
    away = redis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=0.5, socket_connect_timeout=0.5)
    text = render(WorkspaceBreakers({"default": RedisBreaker(away, key_prefix="test:away:")})).decode()
    assert "# TYPE dispatcher_workspace_paused gauge" in text
    assert _samples(text, "dispatcher_workspace_paused") == {}


def test_every_route_exports_its_delivery_deadline() -> None:
    settings = example_settings(api_url="http://127.0.0.1:9")
    samples = _samples(render(RouteDeadlines(settings.routes)).decode(), "dispatcher_route_delivery_deadline_seconds")
    assert samples == {f'route="{name}"': route.delivery_deadline_s for name, route in settings.routes.items()}
    assert samples['route="reminders"'] == 900.0


def test_the_deployment_reads_the_breakers_only_where_the_workers_share_them(redis_url: str) -> None:
    embedded = example_settings(api_url="http://127.0.0.1:9", broker_url="filesystem://")
    assert [type(one) for one in deployment_collectors(embedded)] == [RouteDeadlines]
    shared = example_settings(api_url="http://127.0.0.1:9", broker_url=f"{redis_url}/3")
    assert [type(one) for one in deployment_collectors(shared)] == [RouteDeadlines, WorkspaceBreakers]


def test_the_callback_urls_paused_are_counted_in_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/paused.sqlite"
    upgrade_database(url)
    sessions = session_factory(shared_engine(url))
    states = NotificationStates(sessions)
    assert _value(render(states).decode(), "dispatcher_callback_urls_paused") == 0.0
    key = outbox.url_key("https://host.example/callbacks?token=secret-in-the-url")
    start = utcnow()
    with sessions.begin() as session:
        outbox.endpoint_failed(session, key, now=start, error="HTTP 500", pause_after=timedelta(seconds=60))
    with sessions.begin() as session:
        assert outbox.endpoint_failed(session, key, now=start + timedelta(seconds=61), error="HTTP 500",
                                      pause_after=timedelta(seconds=60))
    text = render(states).decode()
    assert _value(text, "dispatcher_callback_urls_paused") == 1.0
    assert "host.example" not in text and key not in text  # neither the URL nor its key


def _value(text: str, metric: str) -> float:
    match = re.search(rf"^{re.escape(metric)} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match is not None, f"{metric} not in the scrape"
    return float(match.group(1))
