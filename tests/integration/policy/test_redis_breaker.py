"""The breaker shared through Redis: every worker sees the pause, and exactly one probes after it."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
import redis

from dispatcher.policy.breaker import BreakerPlan, Pause, Probe, RedisBreaker

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_url, socket_timeout=5)
    yield connection
    connection.close()


def test_one_trip_pauses_every_worker_and_one_probes_after(client: redis.Redis) -> None:
    clock, prefix = Clock(), f"test:{uuid.uuid4().hex}:"
    workers = [RedisBreaker(client, BreakerPlan(base_s=10, cap_s=60), key_prefix=prefix, clock=clock,
                            rng=random.Random(n)) for n in range(3)]
    try:
        assert all(worker.gate() is None for worker in workers)
        pause, opened = workers[0].trip("auth", "the workspace refused the API token (HTTP 401)")
        assert opened and 8.0 <= pause.until - clock.now <= 10.0
        seen = [worker.gate() for worker in workers]
        assert all(isinstance(gate, Pause) and gate.reason == "auth" for gate in seen)  # the others see it at once
        assert workers[1].trip("auth", "again")[1] is False  # a second failure extends, it does not open anew
        clock.now += 60
        gates = [worker.gate() for worker in workers]
        assert sum(isinstance(gate, Probe) for gate in gates) == 1  # exactly one worker probes
        assert workers[2].close() is True
        assert all(worker.gate() is None for worker in workers)
    finally:
        client.delete(prefix + "breaker", prefix + "breaker:probe")
