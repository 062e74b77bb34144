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


def test_server_errors_of_every_worker_count_together_and_the_one_that_saw_them_ends_the_streak(
        client: redis.Redis) -> None:
    clock, prefix = Clock(), f"test:{uuid.uuid4().hex}:"
    workers = [RedisBreaker(client, BreakerPlan(base_s=10, cap_s=60, trip_after_server_errors=5), key_prefix=prefix,
                            clock=clock, rng=random.Random(n)) for n in range(3)]
    try:
        # four 5xx across three workers, then one of them gets an answer: the streak ends
        assert [workers[n % 3].server_error() for n in range(4)] == [None] * 4
        workers[0].answered()
        assert client.exists(prefix + "breaker:streak") == 0
        workers[2].answered()  # a worker with no streak of its own makes no call (nothing to end)
        # five in a row, from every worker: it trips as unavailable, and every worker waits
        tripped = [workers[n % 3].server_error() for n in range(5)]
        assert tripped[:4] == [None] * 4 and tripped[4] is not None and tripped[4][1] is True
        assert all(isinstance(gate, Pause) and gate.reason == "unavailable" for gate in (w.gate() for w in workers))
        assert 0 < client.pttl(prefix + "breaker:streak")  # never kept for ever
        clock.now += 60
        prober = next(worker for worker in workers if isinstance(worker.gate(), Probe))
        assert prober.close() is True and client.exists(prefix + "breaker:streak") == 0
    finally:
        client.delete(prefix + "breaker", prefix + "breaker:probe", prefix + "breaker:streak")
