"""Sends before reads on the LocalLimiter (injected clock), with the workers' buckets and limits:
status reads get at most reads_fraction_of_api_requests of the account's budget, sends the rest
(and all of it when nobody reads), and after a 429 the sends are granted again before the reads.
The same scenarios run on the RedisLimiter in tests/integration/policy/test_redis_limiter.py."""

from __future__ import annotations

import math

import pytest

from dispatcher.context import READS_BUCKET, limits_of, pause_after_429, reads_per_minute
from dispatcher.errors import ConfigurationError
from dispatcher.policy.ratelimit import WINDOW_S, LocalLimiter
from tests.support.reads_share import FakeClock, ask, settings

pytestmark = pytest.mark.usefixtures("clean_environment")  # no DISPATCHER_* of the shell in the settings


def limiter_of(**overrides: object) -> tuple[LocalLimiter, FakeClock]:
    clock = FakeClock(1000.0)
    return LocalLimiter(limits_of(settings(**overrides)), clock=clock), clock


def test_the_reads_get_a_fifth_of_the_default_budget_rounded_up() -> None:
    # given the defaults (2,400 a minute, 0.2); then reads may take 480 a minute
    assert settings().reads_fraction_of_api_requests == 0.2
    assert limits_of(settings())[READS_BUCKET].per_minute == 480
    # and a share that is no whole number of calls is rounded up: never a bucket of 0
    assert reads_per_minute(settings(api_requests_per_minute=2401)) == 481
    assert reads_per_minute(settings(api_requests_per_minute=3, reads_fraction_of_api_requests=0.01)) == 1
    assert reads_per_minute(settings(reads_fraction_of_api_requests=1)) == 2400


@pytest.mark.parametrize("fraction", [0, -0.2, 1.01, 20, float("nan")])
def test_a_fraction_outside_zero_to_one_is_refused_naming_its_key(fraction: float) -> None:
    with pytest.raises(ConfigurationError) as refused:
        settings(reads_fraction_of_api_requests=fraction)
    assert refused.value.key.startswith("DISPATCHER_READS_FRACTION_OF_API_REQUESTS")


def test_with_sends_and_reads_both_asking_for_minutes_reads_get_their_share_and_sends_the_rest() -> None:
    # given the default limits, and sends and reads each asking every 10 ms for three minutes
    limiter, clock = limiter_of()
    grants = ask(limiter, clock, seconds=3 * WINDOW_S, step_s=0.01)
    # then in the first minute the reads got their 480 and the sends the other 1,872 (the last 48
    # of the 2,400 are kept for urgent sends, docs/priorities.md)
    assert (grants.in_span(grants.reads, 0.0), grants.in_span(grants.sends, 0.0)) == (480, 1872)
    # and in every minute after it, and in any 60-second span, the reads never got more than 480
    for minute in (1, 2):
        start = minute * WINDOW_S
        assert grants.in_span(grants.reads, start) == 480
        assert grants.in_span(grants.sends, start) == 1872
    assert grants.most_in_any_minute(grants.reads) == 480
    # the reads' share of what normal calls were granted: 480 of the 2,352 they may have a minute
    assert math.isclose(len(grants.reads) / (len(grants.reads) + len(grants.sends)), 480 / 2352)


def test_reads_alone_get_no_more_than_their_share_and_sends_alone_get_it_all() -> None:
    # given nobody sending, and reads asking every 10 ms for two minutes
    limiter, clock = limiter_of()
    reads = ask(limiter, clock, seconds=2 * WINDOW_S, step_s=0.01, sends=False).reads
    # then they got 480 a minute, not the 2,400 nobody else wanted
    assert len(reads) == 960
    assert max(sum(1 for at in reads if start <= at < start + WINDOW_S) for start in reads) == 480
    # and sends alone, in a fresh limiter, get the whole budget
    limiter, clock = limiter_of()
    assert len(ask(limiter, clock, seconds=WINDOW_S, step_s=0.01, reads=False).sends) == 2400 - 48  # urgent's reserve


def test_after_a_429_the_sends_are_granted_again_before_the_reads() -> None:
    # given room in every bucket, and a 429 that pauses the limiter for 5 s
    limiter, clock = limiter_of()
    pause_after_429(limiter, 5.0)
    # when sends and reads both ask every 10 ms
    grants = ask(limiter, clock, seconds=20.0, step_s=0.01)
    # then the sends go on after the 5 s, the reads only after twice that
    assert grants.sends[0] == pytest.approx(5.0)
    assert grants.reads[0] == pytest.approx(10.0)
    assert limiter.paused_for() == 0.0 and limiter.paused_for(READS_BUCKET) == 0.0


def test_a_later_shorter_429_never_shortens_the_reads_pause() -> None:
    # given a 429 that paused the sends 10 s and the reads 20 s
    limiter, clock = limiter_of()
    pause_after_429(limiter, 10.0)
    # when another 429, 12 s later, asks for 1 s
    clock.now += 12.0
    pause_after_429(limiter, 1.0)
    # then the sends wait 1 s, the reads the 8 s still left of their first pause
    assert limiter.paused_for() == pytest.approx(1.0)
    assert limiter.paused_for(READS_BUCKET) == pytest.approx(8.0)
