"""What the broker carries, and so what Flower shows: notification and delivery IDs, nothing else."""

from __future__ import annotations

import base64
import json

import pytest
import redis

from dispatcher.enqueue import CeleryEnqueuer
from tests.support.sandbox_process import free_port
from tests.support.worker_process import fresh_broker_url

pytestmark = pytest.mark.integration


def _messages(broker_url: str, queue: str) -> list[dict]:
    client = redis.Redis.from_url(broker_url)
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


def test_send_and_outcome_tasks_carry_ids_only(redis_url: str) -> None:
    broker_url = fresh_broker_url(redis_url)
    enqueuer = CeleryEnqueuer(broker_url)
    try:
        assert enqueuer.enqueue_send([42]) == [42]
        enqueuer.enqueue_outcome(7)
    finally:
        enqueuer.close()
    [send] = _messages(broker_url, "dispatcher.send")
    [outcome] = _messages(broker_url, "dispatcher.outcomes")
    for message, task, shown, argument in ((send, "dispatcher.send", "(notification=42)", 42),
                                           (outcome, "dispatcher.outcome", "(delivery=7)", 7)):
        headers = message["headers"]
        assert headers["task"] == task
        assert headers["argsrepr"] == shown  # what Flower and the worker log display
        assert headers["kwargsrepr"] == "{}"
        args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        assert args == [argument] and kwargs == {}


def test_a_batch_of_sends_is_published_whole_with_ids_only(redis_url: str) -> None:
    broker_url = fresh_broker_url(redis_url)
    enqueuer = CeleryEnqueuer(broker_url)
    try:
        assert enqueuer.enqueue_send([5, 6, 7]) == [5, 6, 7]
    finally:
        enqueuer.close()
    messages = _messages(broker_url, "dispatcher.send")
    assert sorted(json.loads(base64.b64decode(message["body"]))[0][0] for message in messages) == [5, 6, 7]
    assert sorted(message["headers"]["argsrepr"] for message in messages) == [
        "(notification=5)", "(notification=6)", "(notification=7)"]


@pytest.mark.parametrize("ids", [[1], [1, 2, 3]])
def test_a_broker_that_does_not_answer_publishes_nothing_and_raises_nothing(ids: list[int]) -> None:
    enqueuer = CeleryEnqueuer(f"redis://127.0.0.1:{free_port()}/0")  # nobody listens there
    try:
        assert enqueuer.enqueue_send(ids) == []  # the sweep publishes them later
    finally:
        enqueuer.close()
