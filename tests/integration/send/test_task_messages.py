"""What the broker carries, and so what Flower shows: notification and delivery IDs, nothing else."""

from __future__ import annotations

import base64
import json

import pytest
import redis

from dispatcher.enqueue import CeleryEnqueuer
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
