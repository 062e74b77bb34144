"""Rate limits shared by every worker: sliding one-minute windows, and a global pause.

Why a sliding log and not a token bucket or GCRA: the service counts whole minutes, and a bucket
refilled at N a minute with a burst of N lets close to 2N through in some 60-second span. Here
a bucket grants at most ``per_minute`` in ANY 60-second span, and a refused acquire says how long
until its oldest grant leaves the window. Memory is one entry per grant in the last minute.

Buckets are free strings: ``account`` (every API call; the service allows 3,000 a minute per
client address), ``search`` (contact search: 100 a minute per account), ``route:<name>`` (a
per-route cap, e.g. the low-volume web-session channel). A bucket without a configured
:class:`Limit` is refused with ValueError: a typo must not switch a limit off.

A 429 pauses EVERY worker: :meth:`Limiter.pause` makes every acquire answer "wait" until the
pause ends. A pause may also hold one bucket only (``pause(seconds, bucket=...)``): every acquire
that takes that bucket waits, the others go on. That is how a lane of calls backs off longer than
the rest (the status reads, :mod:`dispatcher.context`). Several buckets are taken all-or-nothing
(:func:`acquire_all`): a refusal consumes nothing anywhere, so no grant is lost.

Implementations: :class:`RedisLimiter` (across processes and hosts, atomic in Redis) and
:class:`LocalLimiter` (one process, thread-safe, for the embedded setup without Redis: N worker
processes then get N times the limit). Configure limits below the service's (say 2,700 and 90):
other clients may share the address, and a 429 costs a pause for everyone.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import redis

__all__ = ["WINDOW_S", "Limit", "Limiter", "LocalLimiter", "RedisLimiter", "acquire_all",
           "route_bucket"]

WINDOW_S = 60.0  # every Limit counts grants over the last 60 seconds
_MIN_WAIT_S = 0.001  # a refusal always says "wait" with a positive number

# Redis keys, all under the limiter's key_prefix. On Redis Cluster give a prefix with a hash tag
# ("{dispatcher:rl}:") so one script's keys share a slot.
DEFAULT_KEY_PREFIX = "dispatcher:rl:"
PAUSE_KEY = "pause"  # string: pause end, unix ms; expires when the pause ends
BUCKET_PAUSE_KEY = "pause:{bucket}"  # string: the same, for one bucket's own pause
BUCKET_KEY = "bucket:{bucket}"  # sorted set: one member per grant, score = grant time, unix ms


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``per_minute`` grants in any 60-second span."""

    per_minute: int

    def __post_init__(self) -> None:
        if isinstance(self.per_minute, bool) or not isinstance(self.per_minute, int) or self.per_minute < 1:
            raise ValueError("per_minute must be an int >= 1")


@runtime_checkable
class Limiter(Protocol):
    """What the send path needs. Waits are seconds; 0.0 means granted and consumed."""

    def acquire(self, bucket: str) -> float:
        """Take one slot: 0.0 if granted, else seconds to wait (nothing consumed)."""
        ...

    def acquire_many(self, buckets: Sequence[str]) -> float:
        """Take one slot in each bucket, all or nothing; same answer as :meth:`acquire`."""
        ...

    def pause(self, seconds: float, *, bucket: str | None = None) -> None:
        """Refuse every acquire (with ``bucket``: every acquire that takes it) for ``seconds`` from
        now; never shortens a longer pause."""
        ...

    def paused_for(self, bucket: str | None = None) -> float:
        """Seconds left in the global pause (with ``bucket``: in that bucket's own), 0.0 when none."""
        ...


def route_bucket(route: str) -> str:
    """The bucket name of a route's own cap."""
    return f"route:{route}"


def acquire_all(limiter: Limiter, buckets: Iterable[str]) -> float:
    """Take one slot in every bucket at once, or none: 0.0 if granted, else seconds to wait.

    Duplicates count once. With no bucket at all, only the pause applies (0.0 or its rest).
    """
    unique = tuple(dict.fromkeys(buckets))
    return limiter.acquire_many(unique)


def _check_buckets(limits: Mapping[str, Limit], buckets: Sequence[str]) -> None:
    """ValueError for a bucket with no configured limit (names the bucket, nothing else)."""
    for bucket in buckets:
        if bucket not in limits:
            raise ValueError(f"no rate limit configured for bucket {bucket!r}")


class LocalLimiter:
    """The limiter for one process (thread-safe): for the embedded setup with no Redis.

    Limits hold per process only. ``clock`` is monotonic seconds; inject one in tests.
    """

    def __init__(self, limits: Mapping[str, Limit], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._limits = dict(limits)
        self._clock = clock
        self._lock = threading.Lock()
        self._grants: dict[str, deque[float]] = {bucket: deque() for bucket in self._limits}
        self._paused_until = float("-inf")
        self._bucket_paused_until: dict[str, float] = {}

    def acquire(self, bucket: str) -> float:
        return self.acquire_many((bucket,))

    def acquire_many(self, buckets: Sequence[str]) -> float:
        unique = tuple(dict.fromkeys(buckets))
        _check_buckets(self._limits, unique)
        with self._lock:
            now = self._clock()
            # The pauses first: the answer is the longest of the global one and the buckets' own.
            wait_s = max([0.0, *(self._bucket_paused_until.get(bucket, now) - now for bucket in unique)])
            if self._paused_until > now:
                return max(self._paused_until - now, wait_s)
            if wait_s > 0:
                wait_s = max(wait_s, _MIN_WAIT_S)
            for bucket in unique:
                grants = self._grants[bucket]
                while grants and grants[0] <= now - WINDOW_S:
                    grants.popleft()
                if len(grants) >= self._limits[bucket].per_minute:
                    wait_s = max(wait_s, grants[0] + WINDOW_S - now, _MIN_WAIT_S)
            if wait_s > 0:
                return wait_s
            for bucket in unique:
                self._grants[bucket].append(now)
            return 0.0

    def pause(self, seconds: float, *, bucket: str | None = None) -> None:
        if bucket is not None:
            _check_buckets(self._limits, (bucket,))
        if not seconds > 0:
            return
        with self._lock:
            until = self._clock() + seconds
            if bucket is None:
                self._paused_until = max(self._paused_until, until)
            else:
                self._bucket_paused_until[bucket] = max(self._bucket_paused_until.get(bucket, until), until)

    def paused_for(self, bucket: str | None = None) -> float:
        with self._lock:
            until = self._paused_until if bucket is None else self._bucket_paused_until.get(bucket, float("-inf"))
            return max(0.0, until - self._clock())


# KEYS[1] the global pause key, then per bucket its key and its own pause key (KEYS[2j], KEYS[2j+1]
# for bucket j); ARGV: now_ms, window_ms, member, one limit per bucket (ARGV[3+j]).
# Returns 0 (granted in every bucket) or the wait in ms (nothing taken anywhere).
_ACQUIRE_LUA = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local buckets = (#KEYS - 1) / 2
local wait = 0
for j = 1, buckets do
  local bucket_paused_until = tonumber(redis.call('GET', KEYS[2 * j + 1]) or '0')
  if bucket_paused_until > now then wait = math.max(wait, bucket_paused_until - now) end
end
local paused_until = tonumber(redis.call('GET', KEYS[1]) or '0')
if paused_until > now then return math.max(paused_until - now, wait) end
for j = 1, buckets do
  local key = KEYS[2 * j]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  if redis.call('ZCARD', key) >= tonumber(ARGV[3 + j]) then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + window - now, 1)
  end
end
if wait > 0 then return wait end
for j = 1, buckets do
  redis.call('ZADD', KEYS[2 * j], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[2 * j], window)
end
return 0
"""

# KEYS[1] pause key; ARGV: until_ms, ttl_ms. Only ever lengthens the pause.
_PAUSE_LUA = """
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 0
"""


class RedisLimiter:
    """The limiter shared by every process through Redis: one Lua call (one round trip) per
    acquire, atomic across buckets; keys expire on their own a minute after the last grant.

    ``clock`` is unix seconds and must agree across hosts (NTP): grants are stamped by the
    caller's clock. Redis errors propagate (``redis.RedisError``): with no limiter, nothing is
    sent unmetered; the task retries.
    """

    def __init__(self, client: redis.Redis, limits: Mapping[str, Limit], *,
                 key_prefix: str = DEFAULT_KEY_PREFIX,
                 clock: Callable[[], float] = time.time) -> None:
        self._limits = dict(limits)
        self._prefix = key_prefix
        self._clock = clock
        self._client = client
        self._acquire = client.register_script(_ACQUIRE_LUA)
        self._pause = client.register_script(_PAUSE_LUA)

    def key(self, bucket: str | None = None) -> str:
        """The Redis key of a bucket, or of the pause when ``bucket`` is None."""
        if bucket is None:
            return self._prefix + PAUSE_KEY
        return self._prefix + BUCKET_KEY.format(bucket=bucket)

    def pause_key(self, bucket: str | None = None) -> str:
        """The Redis key of a bucket's own pause, or of the global pause when ``bucket`` is None."""
        if bucket is None:
            return self._prefix + PAUSE_KEY
        return self._prefix + BUCKET_PAUSE_KEY.format(bucket=bucket)

    def acquire(self, bucket: str) -> float:
        return self.acquire_many((bucket,))

    def acquire_many(self, buckets: Sequence[str]) -> float:
        unique = tuple(dict.fromkeys(buckets))
        _check_buckets(self._limits, unique)
        keys = [self.pause_key()]
        for bucket in unique:
            keys += [self.key(bucket), self.pause_key(bucket)]
        args: list[int | str] = [_now_ms(self._clock), int(WINDOW_S * 1000), secrets.token_hex(8)]
        args += [self._limits[bucket].per_minute for bucket in unique]
        wait_ms = int(self._acquire(keys=keys, args=args))
        return max(wait_ms / 1000.0, _MIN_WAIT_S) if wait_ms > 0 else 0.0

    def pause(self, seconds: float, *, bucket: str | None = None) -> None:
        if bucket is not None:
            _check_buckets(self._limits, (bucket,))
        if not seconds > 0:
            return
        pause_ms = math.ceil(seconds * 1000)
        # The key outlives the pause by a second, so clock drift never ends it early.
        self._pause(keys=[self.pause_key(bucket)], args=[_now_ms(self._clock) + pause_ms, pause_ms + 1000])

    def paused_for(self, bucket: str | None = None) -> float:
        value: Any = self._client.get(self.pause_key(bucket))  # bytes from a synchronous client
        if value is None:
            return 0.0
        return max(0.0, (float(value) - _now_ms(self._clock)) / 1000.0)


def _now_ms(clock: Callable[[], float]) -> int:
    return int(clock() * 1000)
