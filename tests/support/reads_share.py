"""Sends before reads, as scenarios any limiter is put through: the LocalLimiter with an injected
clock (tests/unit/policy/test_reads_share.py) and the RedisLimiter on a Redis server of the tests'
own (tests/integration/policy/test_redis_limiter.py). The buckets and the pause after a 429 are
the ones the workers use (``dispatcher.context``), so the limits come from the settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatcher.context import ACCOUNT_BUCKET, READS_BUCKET
from dispatcher.policy.ratelimit import WINDOW_S, Limiter
from dispatcher.settings import Settings, load_settings

REQUIRED = {"api_url": "http://127.0.0.1:3000", "account_id": 1, "api_token": "tok-reads-share"}
SEND = (ACCOUNT_BUCKET,)  # what a createMessage takes (a known contact's send)
READ = (ACCOUNT_BUCKET, READS_BUCKET)  # what every status read of tracking takes


def settings(**overrides: object) -> Settings:
    return load_settings(**{**REQUIRED, **overrides})


class FakeClock:
    """Seconds, set by the scenario (monotonic for LocalLimiter, unix for RedisLimiter)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Grants:
    """When each lane was granted, in seconds from the scenario's start."""

    sends: list[float] = field(default_factory=list)
    reads: list[float] = field(default_factory=list)

    def in_span(self, lane: list[float], start: float) -> int:
        return sum(1 for at in lane if start <= at < start + WINDOW_S)

    def most_in_any_minute(self, lane: list[float]) -> int:
        """The most grants of ``lane`` in any 60-second span (spans start at a grant)."""
        return max((self.in_span(lane, start) for start in lane), default=0)


def ask(limiter: Limiter, clock: FakeClock, *, seconds: float, step_s: float, sends: bool = True,
        reads: bool = True) -> Grants:
    """Sends and reads (either may stay silent) each ask once every ``step_s`` for ``seconds``,
    taking turns at going first so that neither wins by its place in the loop."""
    start = clock.now
    grants = Grants()
    lanes = [(SEND, grants.sends)] if sends else []
    lanes += [(READ, grants.reads)] if reads else []
    for step in range(round(seconds / step_s)):
        clock.now = start + step * step_s
        for buckets, granted in (lanes if step % 2 == 0 else lanes[::-1]):
            if limiter.acquire_many(buckets) == 0.0:
                granted.append(clock.now - start)
    return grants
