"""LocalLimiter with an injected clock, acquire_all, and the Limit value.

fakeredis 2.40 here has no Lua (``lupa`` is not installed: EVAL is an unknown command), so
RedisLimiter is tested against the real Redis in tests/integration/policy/.
"""

from __future__ import annotations

import threading

import pytest

from dispatcher.policy.ratelimit import WINDOW_S, Limit, Limiter, LocalLimiter, RedisLimiter, acquire_all, route_bucket


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(limits: dict[str, int]) -> tuple[LocalLimiter, FakeClock]:
    clock = FakeClock()
    return LocalLimiter({name: Limit(n) for name, n in limits.items()}, clock=clock), clock


def test_grants_exactly_n_a_minute_then_says_when() -> None:
    # given a limit of 5 a minute, grants spread over 10 seconds
    limiter, clock = make({"account": 5})
    grants = []
    for _ in range(5):
        grants.append(limiter.acquire("account"))
        clock.now += 2.0
    # when a sixth is asked for at t+10 s
    wait_s = limiter.acquire("account")
    # then the five were granted and the sixth waits until the first leaves the window
    assert grants == [0.0] * 5
    assert wait_s == pytest.approx(WINDOW_S - 10.0)
    # and at that moment exactly one more is granted, and no second one
    clock.now += wait_s
    assert limiter.acquire("account") == 0.0
    assert limiter.acquire("account") == pytest.approx(2.0)


def test_a_refusal_consumes_nothing() -> None:
    # given a full bucket
    limiter, clock = make({"search": 2})
    limiter.acquire("search"), limiter.acquire("search")
    # when it is asked many times before the window moves
    for _ in range(50):
        assert limiter.acquire("search") > 0
    # then once the window has passed, the full limit is available again
    clock.now += WINDOW_S
    assert [limiter.acquire("search") for _ in range(3)][:2] == [0.0, 0.0]


def test_never_more_than_n_in_any_sixty_seconds() -> None:
    # given a limit of 7 and a caller trying every 0.25 s for five minutes
    limiter, clock = make({"account": 7})
    granted_at: list[float] = []
    for step in range(1200):
        clock.now = 1000.0 + step * 0.25
        if limiter.acquire("account") == 0.0:
            granted_at.append(clock.now)
    # then every 60-second span holds at most 7 grants, and the limit was used (5 windows)
    for i, start in enumerate(granted_at):
        assert sum(1 for t in granted_at[i:] if t < start + WINDOW_S) <= 7
    assert len(granted_at) == 35


def test_buckets_are_independent() -> None:
    # given two buckets; when one is full; then the other still grants
    limiter, _ = make({"search": 1, "account": 3})
    assert limiter.acquire("search") == 0.0
    assert limiter.acquire("search") > 0
    assert limiter.acquire("account") == 0.0


def test_pause_refuses_every_bucket_until_it_ends() -> None:
    # given a limiter with room in every bucket
    limiter, clock = make({"account": 100, "search": 100})
    # when a 429 pauses it for 30 s
    limiter.pause(30.0)
    # then every bucket and even an empty set of buckets answers with the rest of the pause
    assert limiter.paused_for() == pytest.approx(30.0)
    assert limiter.acquire("account") == pytest.approx(30.0)
    clock.now += 10.0
    assert acquire_all(limiter, ["search"]) == pytest.approx(20.0)
    assert acquire_all(limiter, []) == pytest.approx(20.0)
    # and after it ends everything is granted again; the refusals consumed nothing
    clock.now += 20.0
    assert limiter.paused_for() == 0.0
    assert acquire_all(limiter, ["account", "search"]) == 0.0


def test_a_shorter_pause_never_shortens_a_longer_one() -> None:
    # given a 60 s pause; when a later 429 asks for 5 s; then the 60 s still hold
    limiter, clock = make({"account": 1})
    limiter.pause(60.0)
    clock.now += 1.0
    limiter.pause(5.0)
    assert limiter.paused_for() == pytest.approx(59.0)
    # and a zero or negative pause is a no-op
    limiter.pause(0.0)
    limiter.pause(-3.0)
    assert limiter.paused_for() == pytest.approx(59.0)


def test_a_bucket_s_own_pause_holds_only_the_acquires_that_take_it() -> None:
    # given room everywhere, and a pause of the "reads" bucket alone for 20 s
    limiter, clock = make({"account": 100, "reads": 100})
    limiter.pause(20.0, bucket="reads")
    # then an acquire that takes it waits the pause's rest; one that does not is granted
    assert limiter.paused_for("reads") == pytest.approx(20.0) and limiter.paused_for() == 0.0
    assert acquire_all(limiter, ["account", "reads"]) == pytest.approx(20.0)
    assert limiter.acquire("account") == 0.0
    clock.now += 15.0
    assert limiter.acquire("reads") == pytest.approx(5.0)
    # and the refusals took nothing: after the pause the account bucket holds the two grants only
    clock.now += 5.0
    assert limiter.paused_for("reads") == 0.0
    assert acquire_all(limiter, ["account", "reads"]) == 0.0
    later = [limiter.acquire("account") for _ in range(99)]
    assert later[:98] == [0.0] * 98 and later[98] > 0


def test_a_bucket_s_pause_only_lengthens_and_the_answer_is_the_longest_pause() -> None:
    # given a 30 s pause of one bucket; when a later one asks for 5 s; then the 30 s hold
    limiter, clock = make({"account": 10, "reads": 10})
    limiter.pause(30.0, bucket="reads")
    clock.now += 1.0
    limiter.pause(5.0, bucket="reads")
    limiter.pause(0.0, bucket="reads")
    assert limiter.paused_for("reads") == pytest.approx(29.0)
    # and with a global pause meanwhile, each acquire waits for the longest pause that holds it
    limiter.pause(10.0)
    assert acquire_all(limiter, ["account", "reads"]) == pytest.approx(29.0)
    assert limiter.acquire("account") == pytest.approx(10.0)
    clock.now += 10.0
    assert acquire_all(limiter, ["account", "reads"]) == pytest.approx(19.0)
    assert limiter.acquire("account") == 0.0


def test_a_bucket_s_pause_and_its_full_window_answer_the_longer_wait() -> None:
    # given a full bucket whose oldest grant leaves in 60 s, and a 10 s pause of it
    limiter, _ = make({"reads": 1})
    assert limiter.acquire("reads") == 0.0
    limiter.pause(10.0, bucket="reads")
    # then the answer is the time until both let it through
    assert limiter.acquire("reads") == pytest.approx(WINDOW_S)


def test_pausing_an_unknown_bucket_is_refused_loudly() -> None:
    limiter, _ = make({"account": 1})
    with pytest.raises(ValueError, match="raeds"):
        limiter.pause(5.0, bucket="raeds")


def test_acquire_all_is_all_or_nothing() -> None:
    # given a web-session route capped at 1 a minute, and room in the account bucket
    route = route_bucket("web")
    limiter, clock = make({"account": 10, route: 1})
    assert acquire_all(limiter, ["account", route]) == 0.0
    # when both are asked for again and the route refuses
    for _ in range(5):
        assert acquire_all(limiter, ["account", route]) == pytest.approx(WINDOW_S)
    # then the account bucket lost nothing: its 9 remaining slots are all there
    assert [limiter.acquire("account") for _ in range(10)] == [0.0] * 9 + [pytest.approx(WINDOW_S)]


def test_acquire_all_counts_a_repeated_bucket_once() -> None:
    # given a limit of 1; when the same bucket is named twice; then one slot is taken, granted
    limiter, _ = make({"account": 1})
    assert acquire_all(limiter, ["account", "account"]) == 0.0
    assert limiter.acquire("account") > 0


def test_the_wait_is_the_longest_of_the_refusing_buckets() -> None:
    # given two full buckets filled at different times
    limiter, clock = make({"a": 1, "b": 1})
    limiter.acquire("a")
    clock.now += 20.0
    limiter.acquire("b")
    # when both are asked for; then the wait is until both have room
    assert acquire_all(limiter, ["a", "b"]) == pytest.approx(WINDOW_S)
    assert acquire_all(limiter, ["a"]) == pytest.approx(WINDOW_S - 20.0)


def test_an_unknown_bucket_is_refused_loudly() -> None:
    # given limits for account only; when a typo is asked for; then ValueError names it
    limiter, _ = make({"account": 1})
    with pytest.raises(ValueError, match="serach"):
        acquire_all(limiter, ["account", "serach"])
    # and nothing was taken from the known bucket
    assert limiter.acquire("account") == 0.0


def test_threads_share_one_local_limit() -> None:
    # given a limit of 50 and 8 threads trying 100 times each at the same instant
    limiter, _ = make({"account": 50})
    granted: list[int] = []
    start = threading.Barrier(8)

    def work() -> None:
        start.wait(timeout=10)
        granted.append(sum(1 for _ in range(100) if limiter.acquire("account") == 0.0))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    # then exactly 50 were granted in total
    assert sum(granted) == 50 and len(granted) == 8


@pytest.mark.parametrize("per_minute", [0, -1, 1.5, True])
def test_limit_refuses_nonsense(per_minute: object) -> None:
    # given a limit that is not a positive int; when building it; then ValueError
    with pytest.raises(ValueError):
        Limit(per_minute)  # type: ignore[arg-type]


def test_both_implementations_satisfy_the_protocol() -> None:
    # given the two limiters; then both are Limiters (the send path takes either)
    import fakeredis

    assert isinstance(LocalLimiter({}), Limiter)
    assert isinstance(RedisLimiter(fakeredis.FakeRedis(), {}), Limiter)


def test_redis_key_names_live_under_the_prefix() -> None:
    # given a RedisLimiter with a prefix (building it sends nothing to Redis)
    import fakeredis

    limiter = RedisLimiter(fakeredis.FakeRedis(), {"search": Limit(1)}, key_prefix="t:rl:")
    # then the pause and bucket keys are the documented ones
    assert limiter.key() == "t:rl:pause"
    assert limiter.key("search") == "t:rl:bucket:search"
    assert limiter.key(route_bucket("web")) == "t:rl:bucket:route:web"
    assert limiter.pause_key() == "t:rl:pause"
    assert limiter.pause_key("search") == "t:rl:pause:search"
