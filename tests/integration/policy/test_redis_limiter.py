"""RedisLimiter against the real Redis on loopback: the same rules as LocalLimiter, and the
guarantee that matters: processes sharing one limit never exceed it, and a pause is global.

Each test uses its own key prefix and deletes its keys afterwards.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from dispatcher.context import READS_BUCKET, limits_of, pause_after_429
from dispatcher.policy.ratelimit import (
    STANDBY_MARGIN_S,
    WINDOW_S,
    Limit,
    RedisLimiter,
    acquire_all,
    route_bucket,
)
from tests.conftest import REPO_ROOT
from tests.support import reads_share, urgent_share

pytestmark = pytest.mark.integration


class FakeClock(reads_share.FakeClock):
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        super().__init__(now)


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_url, socket_timeout=5)
    yield connection
    connection.close()


@pytest.fixture()
def prefix(client: redis.Redis) -> Iterator[str]:
    key_prefix = f"dispatcher-test:rl:{uuid.uuid4().hex}:"
    yield key_prefix
    keys = list(client.scan_iter(match=key_prefix + "*"))
    if keys:
        client.delete(*keys)


def test_grants_exactly_n_then_says_when(client: redis.Redis, prefix: str) -> None:
    # given a limit of 5 a minute and an injected clock
    clock = FakeClock()
    limiter = RedisLimiter(client, {"account": Limit(5)}, key_prefix=prefix, clock=clock)
    # when five are taken 2 s apart and a sixth is asked for
    grants = []
    for _ in range(5):
        grants.append(limiter.acquire("account"))
        clock.now += 2.0
    wait_s = limiter.acquire("account")
    # then five were granted and the sixth waits for the first to leave the window
    assert grants == [0.0] * 5
    assert wait_s == pytest.approx(WINDOW_S - 10.0, abs=0.002)
    clock.now += wait_s
    assert limiter.acquire("account") == 0.0
    assert limiter.acquire("account") > 0


def test_keys_expire_by_themselves(client: redis.Redis, prefix: str) -> None:
    # given a grant and a pause
    limiter = RedisLimiter(client, {"search": Limit(3)}, key_prefix=prefix)
    limiter.acquire("search")
    limiter.pause(2.0)
    # then both keys carry a TTL: a bucket lives a window, the pause a little past its end
    assert 0 < client.pttl(limiter.key("search")) <= WINDOW_S * 1000
    assert 2000 <= client.pttl(limiter.key()) <= 3000
    assert set(client.scan_iter(match=prefix + "*")) == {limiter.key("search").encode(),
                                                         limiter.key().encode()}


def test_several_buckets_are_all_or_nothing(client: redis.Redis, prefix: str) -> None:
    # given a route capped at 1 a minute and an account bucket with room
    route = route_bucket("web")
    limiter = RedisLimiter(client, {"account": Limit(3), route: Limit(1)}, key_prefix=prefix,
                           clock=FakeClock())
    assert acquire_all(limiter, ["account", route]) == 0.0
    # when both are asked for again and the route refuses
    for _ in range(4):
        assert acquire_all(limiter, ["account", route]) == pytest.approx(WINDOW_S)
    # then the account bucket lost nothing: two slots remain, then a refusal
    assert [limiter.acquire("account") for _ in range(3)][:2] == [0.0, 0.0]
    assert client.zcard(limiter.key("account")) == 3 and client.zcard(limiter.key(route)) == 1


def test_pause_refuses_everything_until_it_ends(client: redis.Redis, prefix: str) -> None:
    # given a limiter with room
    clock = FakeClock()
    limiter = RedisLimiter(client, {"account": Limit(100)}, key_prefix=prefix, clock=clock)
    # when a 429 pauses it for 30 s, and a later one asks for only 5 s
    limiter.pause(30.0)
    limiter.pause(5.0)
    # then every acquire, even of no bucket, waits out the 30 s
    assert limiter.paused_for() == pytest.approx(30.0)
    assert limiter.acquire("account") == pytest.approx(30.0)
    clock.now += 25.0
    assert acquire_all(limiter, []) == pytest.approx(5.0)
    # and afterwards it grants again, the refusals having consumed nothing
    clock.now += 5.0
    assert limiter.paused_for() == 0.0 and limiter.acquire("account") == 0.0
    assert client.zcard(limiter.key("account")) == 1


def test_a_bucket_s_own_pause_holds_only_the_acquires_that_take_it(client: redis.Redis, prefix: str) -> None:
    # given room everywhere, and a pause of the "reads" bucket alone for 20 s
    clock = FakeClock()
    limiter = RedisLimiter(client, {"account": Limit(100), "reads": Limit(100)}, key_prefix=prefix, clock=clock)
    limiter.pause(20.0, bucket="reads")
    # then an acquire that takes it waits the pause's rest; one that does not is granted
    assert limiter.paused_for("reads") == pytest.approx(20.0) and limiter.paused_for() == 0.0
    assert acquire_all(limiter, ["account", "reads"]) == pytest.approx(20.0)
    assert limiter.acquire("account") == 0.0
    # and with a global pause meanwhile, each acquire waits for the longest pause that holds it
    limiter.pause(10.0)
    assert acquire_all(limiter, ["account", "reads"]) == pytest.approx(20.0)
    assert limiter.acquire("account") == pytest.approx(10.0)
    # and a shorter pause later changes nothing: a pause only lengthens
    clock.now += 15.0
    limiter.pause(1.0, bucket="reads")
    assert limiter.acquire("reads") == pytest.approx(5.0)
    # and afterwards it grants again, the refusals having taken nothing
    clock.now += 5.0
    assert acquire_all(limiter, ["account", "reads"]) == 0.0
    assert client.zcard(limiter.key("account")) == 2 and client.zcard(limiter.key("reads")) == 1
    # and the bucket's pause is a key of its own under the prefix, living a second past its end
    assert limiter.pause_key("reads") == prefix + "pause:reads"
    assert 0 < client.pttl(limiter.pause_key("reads")) <= 21_000


def test_a_bucket_s_pause_and_its_full_window_answer_the_longer_wait(client: redis.Redis, prefix: str) -> None:
    # given a full bucket whose oldest grant leaves in 60 s, and a 10 s pause of it
    limiter = RedisLimiter(client, {"reads": Limit(1)}, key_prefix=prefix, clock=FakeClock())
    assert limiter.acquire("reads") == 0.0
    limiter.pause(10.0, bucket="reads")
    # then the answer is the time until both let it through
    assert limiter.acquire("reads") == pytest.approx(WINDOW_S)


def test_an_unknown_bucket_is_refused_before_redis(client: redis.Redis, prefix: str) -> None:
    # given limits for account only; when a typo is asked for; then ValueError, no key written
    limiter = RedisLimiter(client, {"account": Limit(1)}, key_prefix=prefix)
    with pytest.raises(ValueError):
        limiter.acquire("serach")
    with pytest.raises(ValueError):
        limiter.pause(5.0, bucket="raeds")
    assert list(client.scan_iter(match=prefix + "*")) == []


# --- several processes -------------------------------------------------------------------------

LIMIT = 50
PROCESSES = 4
TRIES_EACH = 100


def _take(redis_url: str, key_prefix: str, tries: int, start: float) -> tuple[int, int]:
    """In a child: wait for the common start time, try ``tries`` times; (pid, grants)."""
    import time

    connection = redis.Redis.from_url(redis_url, socket_timeout=5)
    limiter = RedisLimiter(connection, {"account": Limit(LIMIT), "search": Limit(LIMIT)},
                           key_prefix=key_prefix)
    time.sleep(max(0.0, start - time.time()))
    granted = sum(1 for _ in range(tries) if acquire_all(limiter, ["account", "search"]) == 0.0)
    connection.close()
    return os.getpid(), granted


def _pause(redis_url: str, key_prefix: str, seconds: float) -> tuple[int, float]:
    connection = redis.Redis.from_url(redis_url, socket_timeout=5)
    limiter = RedisLimiter(connection, {"account": Limit(LIMIT)}, key_prefix=key_prefix)
    limiter.pause(seconds)
    return os.getpid(), limiter.paused_for()


def _observe(redis_url: str, key_prefix: str) -> tuple[int, float, float]:
    connection = redis.Redis.from_url(redis_url, socket_timeout=5)
    limiter = RedisLimiter(connection, {"account": Limit(LIMIT)}, key_prefix=key_prefix)
    return os.getpid(), limiter.paused_for(), limiter.acquire("account")


@pytest.mark.timeout(120)
def test_processes_sharing_a_limit_never_exceed_it(client: redis.Redis, redis_url: str,
                                                   prefix: str) -> None:
    # given 4 processes x 100 tries on two buckets limited to 50 a minute, started together
    import time

    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES) as pool:
        start = time.time() + 3.0  # room for the spawned children to import
        pending = pool.starmap_async(_take, [(redis_url, prefix, TRIES_EACH, start)] * PROCESSES)
        # when they race
        results = pending.get(timeout=90)
    elapsed_s = time.time() - start
    # then exactly the limit was granted in total within the window, in both buckets alike
    assert elapsed_s < WINDOW_S, "the run outlived the window: the count proves nothing"
    assert len({pid for pid, _ in results} | {os.getpid()}) == PROCESSES + 1
    assert sum(granted for _, granted in results) == LIMIT, results
    assert client.zcard(prefix + "bucket:account") == LIMIT
    assert client.zcard(prefix + "bucket:search") == LIMIT


@pytest.mark.timeout(120)
def test_a_pause_set_by_one_process_is_seen_by_another(redis_url: str, prefix: str) -> None:
    # given two separate processes on the same prefix
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as first, context.Pool(1) as second:
        # when one pauses for 30 s
        pauser, set_for_s = first.apply_async(_pause, (redis_url, prefix, 30.0)).get(timeout=60)
        # then the other sees the pause and is refused for about that long
        observer, seen_for_s, wait_s = second.apply_async(_observe, (redis_url, prefix)).get(timeout=60)
    assert len({pauser, observer, os.getpid()}) == 3
    assert 29.0 < set_for_s <= 30.0
    assert 0 < seen_for_s <= set_for_s and 0 < wait_s <= set_for_s
    assert seen_for_s > 20.0 and wait_s > 20.0


# --- sends before reads (the scenarios of tests/unit/policy/test_reads_share.py) ---------------


def _workers_limiter(client: redis.Redis, prefix: str, clock: FakeClock, **overrides: object) -> RedisLimiter:
    """The buckets and limits the workers build from their settings (dispatcher.context)."""
    return RedisLimiter(client, limits_of(reads_share.settings(**overrides)), key_prefix=prefix, clock=clock)


@pytest.mark.usefixtures("clean_environment")
def test_with_sends_and_reads_both_asking_reads_get_their_share_and_sends_the_rest(client: redis.Redis,
                                                                                    prefix: str) -> None:
    # given 600 calls a minute (reads 120), and sends and reads each asking every 40 ms for two minutes
    clock = FakeClock()
    limiter = _workers_limiter(client, prefix, clock, api_requests_per_minute=600)
    grants = reads_share.ask(limiter, clock, seconds=2 * WINDOW_S, step_s=0.04)
    # then in each minute the reads got their 120 and the sends the other 468 (12 are urgent's reserve)
    for start in (0.0, WINDOW_S):
        assert (grants.in_span(grants.reads, start), grants.in_span(grants.sends, start)) == (120, 468)
    # and never more than 120 reads in any 60-second span
    assert grants.most_in_any_minute(grants.reads) == 120


@pytest.mark.usefixtures("clean_environment")
def test_reads_alone_get_no_more_than_their_share(client: redis.Redis, prefix: str) -> None:
    # given nobody sending, and reads asking every 40 ms for two minutes
    clock = FakeClock()
    limiter = _workers_limiter(client, prefix, clock, api_requests_per_minute=600)
    reads = reads_share.ask(limiter, clock, seconds=2 * WINDOW_S, step_s=0.04, sends=False).reads
    # then they got 120 a minute, not the 600 nobody else wanted
    assert len(reads) == 240
    assert max(sum(1 for at in reads if start <= at < start + WINDOW_S) for start in reads) == 120


@pytest.mark.usefixtures("clean_environment")
def test_after_a_429_the_sends_are_granted_again_before_the_reads(client: redis.Redis, prefix: str) -> None:
    # given room in every bucket, and a 429 that pauses the limiter for 5 s
    clock = FakeClock()
    limiter = _workers_limiter(client, prefix, clock)
    pause_after_429(limiter, 5.0)
    # when sends and reads both ask every 40 ms
    grants = reads_share.ask(limiter, clock, seconds=15.0, step_s=0.04)
    # then the sends go on after the 5 s, the reads only after twice that
    assert grants.sends[0] == pytest.approx(5.0)
    assert grants.reads[0] == pytest.approx(10.0)
    # and the pauses are two keys under the prefix
    assert client.exists(limiter.pause_key(), limiter.pause_key(READS_BUCKET)) == 2


def test_the_benchmarks_count_of_grants_by_bucket(client: redis.Redis, redis_url: str, prefix: str) -> None:
    # given the end-to-end benchmark's counter of the limiter's grants (scripts/bench/common.py)
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location("bench_common", REPO_ROOT / "scripts" / "bench" / "common.py")
    assert spec is not None and spec.loader is not None
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    limiter = RedisLimiter(client, {"account": Limit(100), "reads": Limit(100)}, key_prefix=prefix)
    limiter.acquire("account")  # before the count begins: not counted
    time.sleep(0.01)
    # when 7 sends and 3 reads are granted while it counts, every 10 ms, and 2 refused
    with common.LimiterGrants(redis_url, interval_s=0.01, key_prefix=prefix) as grants:
        for _ in range(7):
            assert limiter.acquire("account") == 0.0
            time.sleep(0.005)
        for _ in range(3):
            assert acquire_all(limiter, ["account", "reads"]) == 0.0
        limiter.pause(60.0, bucket="reads")
        assert acquire_all(limiter, ["account", "reads"]) > 0 and acquire_all(limiter, ["account", "reads"]) > 0
    # then it counted each grant once, by bucket, and the reads' share of them
    assert grants.summary() == {"by_bucket": {"account": 10, "reads": 3}, "reads_share": 0.3,
                                "most_reads_in_a_minute": 3, "most_grants_in_a_minute": 10}


@pytest.mark.usefixtures("clean_environment")
def test_an_urgent_call_takes_the_first_slot_that_frees_before_any_normal_one(client: redis.Redis, prefix: str) -> None:
    # the scenarios of tests/unit/policy/test_urgent_share.py, on Redis: from the reserve at once ...
    clock = FakeClock()
    limiter = _workers_limiter(client, prefix, clock, api_requests_per_minute=60)
    assert urgent_share.first_urgent_then_normal(limiter, clock)[0] == 0.0
    # ... and, the reserve spent too, by the standby
    clock = FakeClock()
    limiter = _workers_limiter(client, prefix + "standby:", clock, api_requests_per_minute=60, urgent_reserved_fraction=0)
    urgent_at, normal_after = urgent_share.first_urgent_then_normal(limiter, clock)
    assert urgent_at == pytest.approx(0.05)
    assert min(normal_after) == pytest.approx(urgent_at + STANDBY_MARGIN_S)
    # and a standby is one key under the prefix, gone on its own
    assert 0 < client.pttl(limiter.standby_key("account")) <= (STANDBY_MARGIN_S + 61) * 1000


@pytest.mark.usefixtures("clean_environment")
def test_urgent_calls_take_their_share_and_normal_ones_keep_the_rest(client: redis.Redis, prefix: str) -> None:
    clock = FakeClock()
    limiter = _workers_limiter(client, prefix, clock, api_requests_per_minute=600)
    grants = urgent_share.ask(limiter, clock, seconds=3 * WINDOW_S, step_s=0.04, urgent_from=WINDOW_S)
    assert grants.in_span(grants.normal, 0.0) == 600 - 12  # the reserve: urgent's alone
    for start in (WINDOW_S, 2 * WINDOW_S):
        assert (grants.in_span(grants.urgent, start), grants.in_span(grants.normal, start)) == (480, 108)
