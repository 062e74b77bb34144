"""One task per waiting row (issue 44), counted in a real broker's queue.

A Redis server of the test's own (it is killed and started empty: never a server the test did not
start) and PostgreSQL. No worker consumes: the notifications wait in the broker as a backlog does,
while the sweep runs again and again past several ``stale_after_s`` periods (at its default, 45 s;
the sweep's clock is moved, not the setting). Each row keeps exactly one task; after Redis
restarts empty, each lost row is published exactly once more, and so is a row whose publish never
happened (its publisher died between its commit and its publish).
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import redis

from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.operations.sweep import sweep
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings
from dispatcher.store import queries as store
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import utcnow
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.rabbitmq_vhost import RABBITMQ_HOST, RABBITMQ_PORT, private_vhost
from tests.support.redis_server import PrivateRedis
from tests.support.sandbox_process import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NOTIFICATIONS = 300
RABBITMQ_URL = f"amqp://guest:guest@{RABBITMQ_HOST}:{RABBITMQ_PORT}"
SWEEP_EVERY_S = 5.0  # the beat interval (sweep_interval_s) at its default
PERIODS = 4  # stale_after_s periods the sweeps run through


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def settings(own_redis: PrivateRedis, fresh_postgres_url: str, clean_environment: pytest.MonkeyPatch) -> Settings:
    upgrade_database(fresh_postgres_url)
    return example_settings(api_url="http://127.0.0.1:9", database_url=fresh_postgres_url, broker_url=own_redis.url)


def tasks_by_row(broker_url: str) -> Counter[int]:
    """Every send task waiting in the broker, by notification ID (kombu's priority lists too)."""
    client = redis.Redis.from_url(broker_url)
    try:
        counts: Counter[int] = Counter()
        for key in client.scan_iter(match="dispatcher.send*"):
            if client.type(key) != b"list":
                continue
            for raw in client.lrange(key, 0, -1):
                args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
                counts[int(args[0])] += 1
        return counts
    finally:
        client.close()


def sweeps(dispatcher: Dispatcher, enqueuer: CeleryEnqueuer, start: datetime, periods: int) -> int:
    """A sweep every beat interval of the sweep's clock for ``periods`` stale periods: how many it published."""
    published, stale_after_s = 0, dispatcher.settings.stale_after_s
    for step in range(1, int(periods * stale_after_s / SWEEP_EVERY_S) + 1):
        moment = start + timedelta(seconds=step * SWEEP_EVERY_S)
        published += sweep(sessions=dispatcher.sessions, enqueuer=enqueuer, stale_after_s=stale_after_s,
                           clock=_at(moment))
    return published


def _at(moment: datetime) -> Callable[[], datetime]:
    return lambda: moment


def test_a_backlog_keeps_one_task_a_row_and_a_broker_restart_publishes_each_lost_row_once(
        settings: Settings, own_redis: PrivateRedis) -> None:
    assert settings.stale_after_s == 45.0 and settings.sweep_interval_s == SWEEP_EVERY_S  # the defaults
    enqueuer = CeleryEnqueuer(own_redis.url)
    try:
        dispatcher = Dispatcher(settings, enqueuer=enqueuer)
        # Given N notifications handed over (each published once), and one whose publisher died
        # between its commit and its publish (the mark committed, nothing published)
        items = dispatcher.notify_many([reminder(f"backlog-{n}", identifier=f"patient-{n}", phone="+15550300000")
                                        for n in range(NOTIFICATIONS)])
        assert all(item.outcome.value == "accepted" for item in items)
        with dispatcher.sessions.begin() as session:
            intake.stage(session, parse_request(reminder("orphan", identifier="patient-o", phone="+15550300001")),
                         settings, now=utcnow(), accepting=True)
        with dispatcher.sessions() as session:
            orphan = store.find_notification_by_event(session, "orphan")
            assert orphan is not None and orphan.enqueued_at is not None
            rows = {found.id for n in range(NOTIFICATIONS)
                    if (found := store.find_notification_by_event(session, f"backlog-{n}")) is not None}
        assert tasks_by_row(own_redis.url) == dict.fromkeys(rows, 1)
        assert enqueuer.send_queue_depth() == NOTIFICATIONS
        start = utcnow()

        # When the sweep runs every 5 s past four stale periods, no worker taking anything
        # Then every row still has exactly one task (the orphan's may still be in the queue, as
        # far as the sweep can tell: it waits for the queue to drain)
        assert sweeps(dispatcher, enqueuer, start, PERIODS) == 0
        assert tasks_by_row(own_redis.url) == dict.fromkeys(rows, 1)

        # When Redis is killed and started empty (no persistence: every queued task is lost)
        own_redis.kill()
        own_redis.start()
        assert tasks_by_row(own_redis.url) == {}
        assert enqueuer.send_queue_depth() == 0  # an empty queue has no key: no queue, nothing in it
        # Then the sweeps publish each lost row, and the orphan, exactly once more
        later = start + timedelta(seconds=PERIODS * settings.stale_after_s)
        assert sweeps(dispatcher, enqueuer, later, PERIODS) == NOTIFICATIONS + 1
        assert tasks_by_row(own_redis.url) == dict.fromkeys(rows | {orphan.id}, 1)
    finally:
        enqueuer.close()


def test_the_send_queue_depth_on_redis(own_redis: PrivateRedis) -> None:
    enqueuer = CeleryEnqueuer(own_redis.url)
    try:
        assert enqueuer.send_queue_depth() == 0  # never used: no key
        assert enqueuer.enqueue_send([1, 2, 3]) == [1, 2, 3]
        assert enqueuer.send_queue_depth() == 3
        assert enqueuer.outcome_queue_depth() == 0
        enqueuer.enqueue_outcome(9)  # another queue's task is not a send task
        assert enqueuer.send_queue_depth() == 3
        assert enqueuer.outcome_queue_depth() == 1  # the tracking sweep's question, about its own queue
    finally:
        enqueuer.close()


def test_the_send_queue_depth_on_the_embedded_broker(tmp_path: Path) -> None:
    enqueuer = CeleryEnqueuer(f"filesystem://{tmp_path}/broker")
    try:
        assert enqueuer.send_queue_depth() == 0
        assert enqueuer.enqueue_send([1, 2]) == [1, 2]
        enqueuer.enqueue_outcome(9)
        assert enqueuer.send_queue_depth() == 2
        assert enqueuer.outcome_queue_depth() == 1
    finally:
        enqueuer.close()


def test_the_send_queue_depth_on_rabbitmq() -> None:
    with private_vhost("test-queue-depth") as vhost:
        enqueuer = CeleryEnqueuer(f"{RABBITMQ_URL}/{vhost}")
        try:
            assert enqueuer.send_queue_depth() == 0  # no worker declared the queue yet: no queue, nothing in it
            assert enqueuer.enqueue_send([1, 2, 3]) == [1, 2, 3]  # (confirmed: routed and written)
            enqueuer.enqueue_outcome(9)
            assert enqueuer.send_queue_depth() == 3
            assert enqueuer.enqueue_send([4]) == [4]  # the refused passive declare above left the publisher working
            assert enqueuer.send_queue_depth() == 4
        finally:
            enqueuer.close()


def test_a_broker_that_does_not_answer_cannot_tell_its_depth() -> None:
    enqueuer = CeleryEnqueuer(f"redis://127.0.0.1:{free_port()}/0")  # nobody listens there
    try:
        assert enqueuer.send_queue_depth() is None  # the sweep then judges by age alone
        assert enqueuer.outcome_queue_depth() is None  # the tracking sweep too
    finally:
        enqueuer.close()
