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
        # one notification failing again and again, on every worker, counts once
        assert [workers[n % 3].server_error(99) for n in range(9)] == [None] * 9
        assert client.hget(prefix + "breaker", "streak") == b"1"
        # four notifications' 5xx across three workers, then another worker's run sees the streak
        # and gets an answer: it ends
        assert [workers[n % 3].server_error(n) for n in range(3)] == [None] * 3
        assert workers[2].gate() is None  # closed: the streak is only seen
        workers[2].answered()
        assert client.hkeys(prefix + "breaker") == []
        assert [workers[n % 3].server_error(n) for n in range(4)] == [None] * 4  # counting from 0 again
        # the fifth in a row, from any worker: it trips as unavailable, and every worker waits
        tripped = workers[1].server_error(4)
        assert tripped is not None and tripped[1] is True
        assert all(isinstance(gate, Pause) and gate.reason == "unavailable" for gate in (w.gate() for w in workers))
        assert 0 < client.pttl(prefix + "breaker")  # never kept for ever
        clock.now += 60
        prober = next(worker for worker in workers if isinstance(worker.gate(), Probe))
        assert prober.close() is True and client.exists(prefix + "breaker") == 0
    finally:
        client.delete(prefix + "breaker", prefix + "breaker:probe")
