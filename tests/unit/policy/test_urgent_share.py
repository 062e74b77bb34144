"""Urgent first, normal never starved (docs/priorities.md), on the LocalLimiter with an injected
clock; tests/integration/policy/test_redis_limiter.py runs the same scenarios on the RedisLimiter."""

from __future__ import annotations

import pytest

from dispatcher.context import limits_of
from dispatcher.policy.ratelimit import STANDBY_MARGIN_S, WINDOW_S, LocalLimiter
from tests.support import reads_share, urgent_share
from tests.support.reads_share import FakeClock

pytestmark = pytest.mark.usefixtures("clean_environment")


def _limiter(**overrides: object) -> tuple[LocalLimiter, FakeClock]:
    clock = FakeClock(1000.0)
    return LocalLimiter(limits_of(reads_share.settings(**overrides)), clock=clock), clock


def test_an_urgent_call_behind_a_budget_normal_calls_spent_is_granted_at_once_from_the_reserve() -> None:
    # given 60 calls a minute (1 kept for urgent calls), spent by normal calls every 50 ms
    limiter, clock = _limiter(api_requests_per_minute=60)
    # when an urgent call asks, it is granted at once, from the slot normal calls could not take
    urgent_at, normal_after = urgent_share.first_urgent_then_normal(limiter, clock)
    assert urgent_at == 0.0
    # and the normal calls go on as slots free, nothing held back for it (no standby)
    assert min(normal_after) < STANDBY_MARGIN_S and len(normal_after) >= 55


def test_an_urgent_call_takes_the_first_slot_that_frees_before_any_normal_one() -> None:
    # given 60 calls a minute and no reserve (the standby alone), kept busy by normal calls every 50 ms
    limiter, clock = _limiter(api_requests_per_minute=60, urgent_reserved_fraction=0)
    # when an urgent call asks, and keeps asking with the normal ones (half the time after them)
    urgent_at, normal_after = urgent_share.first_urgent_then_normal(limiter, clock)
    # then it has the first slot that frees (50 ms later), although a normal call asked first there
    assert urgent_at == pytest.approx(0.05)
    # and the normal calls go on once the standby is over: the time the urgent caller had to come back
    assert min(normal_after) == pytest.approx(urgent_at + STANDBY_MARGIN_S)
    assert len(normal_after) == 59


def test_with_both_lanes_asking_all_the_time_urgent_never_passes_its_share_and_normal_is_never_starved() -> None:
    # given 600 calls a minute (urgent's share 0.8: 480), and both lanes asking every 40 ms for four minutes
    limiter, clock = _limiter(api_requests_per_minute=600)
    grants = urgent_share.ask(limiter, clock, seconds=4 * WINDOW_S, step_s=0.04)
    # then in no 60-second span had urgent calls more than their 480 ...
    assert max(grants.in_span(grants.urgent, start) for start in grants.urgent) <= 480
    # ... and each minute the budget was used whole, normal calls having at least the other 108
    # (600 - 480 - the 12 kept for urgent calls)
    for start in (0.0, WINDOW_S, 2 * WINDOW_S, 3 * WINDOW_S):
        urgent, normal = grants.in_span(grants.urgent, start), grants.in_span(grants.normal, start)
        assert urgent + normal == 600 and normal >= 108


def test_urgent_calls_arriving_behind_a_full_budget_are_served_first_up_to_their_share() -> None:
    # given normal calls alone for a minute, using the whole budget
    limiter, clock = _limiter(api_requests_per_minute=600)
    grants = urgent_share.ask(limiter, clock, seconds=3 * WINDOW_S, step_s=0.04, urgent_from=WINDOW_S)
    assert grants.in_span(grants.normal, 0.0) == 600 - 12  # 12 kept for urgent calls
    # then once urgent calls ask too, they get their 480 a minute and normal calls the 108 left
    for start in (WINDOW_S, 2 * WINDOW_S):
        assert (grants.in_span(grants.urgent, start), grants.in_span(grants.normal, start)) == (480, 108)


def test_normal_calls_alone_use_the_whole_budget_and_urgent_ones_alone_their_share() -> None:
    limiter, clock = _limiter(api_requests_per_minute=600)
    assert len(urgent_share.ask(limiter, clock, seconds=WINDOW_S, step_s=0.04, urgent_from=WINDOW_S).normal) == 600 - 12
    limiter, clock = _limiter(api_requests_per_minute=600)
    assert len(urgent_share.ask(limiter, clock, seconds=WINDOW_S, step_s=0.04, normal=False).urgent) == 480


def test_contact_searches_have_the_same_rule() -> None:
    # given 90 searches a minute (urgent's share: 72; 2 kept for urgent ones) spent by normal searches, then urgent ones too
    limiter, clock = _limiter(contact_searches_per_minute=90)
    grants = urgent_share.ask(limiter, clock, seconds=3 * WINDOW_S, step_s=0.04, search=True, urgent_from=WINDOW_S)
    assert grants.in_span(grants.normal, 0.0) == 88  # 2 kept for urgent searches
    for start in (WINDOW_S, 2 * WINDOW_S):
        assert (grants.in_span(grants.urgent, start), grants.in_span(grants.normal, start)) == (72, 16)


def test_a_normal_call_waits_only_for_the_bucket_an_urgent_one_waits_for() -> None:
    # given the search budget full (no reserve: the standby alone) and an urgent search waiting for it
    limiter, clock = _limiter(contact_searches_per_minute=2, urgent_reserved_fraction=0)
    for _ in range(2):
        assert limiter.acquire_many(("account", "search")) == 0.0
    assert limiter.acquire_many(("account", "search", "urgent:account", "urgent:search"), urgent=True) > 0
    # then a normal search waits, but a normal send to a known contact (account alone) goes on
    assert limiter.acquire_many(("account", "search")) > 0
    assert limiter.acquire_many(("account",)) == 0.0
