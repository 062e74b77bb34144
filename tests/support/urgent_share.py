"""Urgent first, normal never starved, as scenarios any limiter is put through: the LocalLimiter
with an injected clock (tests/unit/policy/test_urgent_share.py) and the RedisLimiter on a Redis
server of the tests' own (tests/integration/policy/test_redis_limiter.py). The buckets each call
takes are the workers' own (``dispatcher.context.buckets_of_call``), the limits come from the
settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatcher.context import SEARCH_BUCKET, buckets_of_call
from dispatcher.policy.ratelimit import WINDOW_S, Limiter
from tests.support.reads_share import FakeClock


@dataclass
class Grants:
    """When each lane was granted, in seconds from the scenario's start."""

    urgent: list[float] = field(default_factory=list)
    normal: list[float] = field(default_factory=list)

    @staticmethod
    def in_span(lane: list[float], start: float) -> int:
        return sum(1 for at in lane if start <= at < start + WINDOW_S)


def ask(limiter: Limiter, clock: FakeClock, *, seconds: float, step_s: float, urgent_from: float = 0.0,
        urgent_until: float | None = None, normal: bool = True, search: bool = False) -> Grants:
    """Normal calls ask once every ``step_s`` for ``seconds``; urgent ones too, between
    ``urgent_from`` and ``urgent_until``. They take turns at going first, so that neither wins by
    its place in the loop. ``search``: the calls are contact searches (account and search)."""
    start = clock.now
    grants = Grants()
    shared = (SEARCH_BUCKET,) if search else ()
    for step in range(round(seconds / step_s)):
        clock.now = start + step * step_s
        at = clock.now - start
        lanes = []
        if at >= urgent_from and (urgent_until is None or at < urgent_until):
            lanes.append((True, grants.urgent))
        if normal:
            lanes.append((False, grants.normal))
        for urgent, granted in (lanes if step % 2 == 0 else lanes[::-1]):
            if limiter.acquire_many(buckets_of_call(shared, urgent=urgent), urgent=urgent) == 0.0:
                granted.append(at)
    return grants


def first_urgent_then_normal(limiter: Limiter, clock: FakeClock, *, step_s: float = 0.05) -> tuple[float, list[float]]:
    """A budget kept full by normal calls for a minute; then one urgent call asks, and keeps asking
    until granted while the normal ones go on. Returns when it was granted and when the normal
    calls were granted after it first asked."""
    grants = ask(limiter, clock, seconds=WINDOW_S, step_s=step_s, urgent_from=WINDOW_S)  # normal grants fill it
    asked_at = clock.now
    start = clock.now
    urgent_at: float | None = None
    normal_after: list[float] = []
    for step in range(round(WINDOW_S / step_s)):
        clock.now = start + step * step_s
        order = (True, False) if step % 2 == 0 else (False, True)
        for urgent in order:
            if urgent and urgent_at is not None:
                continue
            if limiter.acquire_many(buckets_of_call((), urgent=urgent), urgent=urgent) == 0.0:
                if urgent:
                    urgent_at = clock.now - asked_at
                else:
                    normal_after.append(clock.now - asked_at)
    assert grants.normal, "the budget was never filled"
    assert urgent_at is not None, "the urgent call was never granted"
    return urgent_at, normal_after
