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

Urgent first (docs/priorities.md): an acquire says whether it is ``urgent``. An urgent acquire
refused by a shared bucket puts that bucket on *standby* until the slot frees (plus
:data:`STANDBY_MARGIN_S`, the time the caller takes to come back): meanwhile every normal acquire
that takes the bucket waits, so the freed slot goes to the urgent call, not to whichever normal
call asks first. Urgent calls also take their own buckets (:func:`urgent_bucket`, a fraction of
the shared ones' limits); an urgent acquire those refuse sets no standby. And a few slots of each
shared budget are kept for urgent calls alone (``Limit.reserved_for_urgent``): a budget normal calls
spent whole in the first seconds of a minute would otherwise make an urgent call wait for the
window to slide, however first it stands. A standby is set only
while the budget is spent (an urgent call was refused), so it never holds normal calls back while
the budget has room; and as the window slides, the slots normal calls leave during a standby are
theirs after it: it delays them, it does not take their share of the minute. So normal calls are held
back only while urgent ones have less than that fraction of the window: they keep the rest, and
are never starved.

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

__all__ = ["STANDBY_MARGIN_S", "WINDOW_S", "Limit", "Limiter", "LocalLimiter", "RedisLimiter", "acquire_all",
           "route_bucket", "urgent_bucket"]

WINDOW_S = 60.0  # every Limit counts grants over the last 60 seconds
_MIN_WAIT_S = 0.001  # a refusal always says "wait" with a positive number
# How long a standby outlasts the wait it was set for: the refused urgent caller sleeps through a
# short wait and comes back at once, or retries its task after a countdown (a broker round trip).
STANDBY_MARGIN_S = 2.0
URGENT_PREFIX = "urgent:"  # an urgent call's own buckets: urgent:account, urgent:search

# Redis keys, all under the limiter's key_prefix. On Redis Cluster give a prefix with a hash tag
# ("{dispatcher:rl}:") so one script's keys share a slot.
DEFAULT_KEY_PREFIX = "dispatcher:rl:"
PAUSE_KEY = "pause"  # string: pause end, unix ms; expires when the pause ends
BUCKET_PAUSE_KEY = "pause:{bucket}"  # string: the same, for one bucket's own pause
BUCKET_KEY = "bucket:{bucket}"  # sorted set: one member per grant, score = grant time, unix ms
STANDBY_KEY = "standby:{bucket}"  # string: standby end, unix ms (an urgent call waits for the bucket)


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``per_minute`` grants in any 60-second span; of them, the last ``reserved_for_urgent``
    only to urgent acquires (a normal acquire sees ``per_minute - reserved_for_urgent``)."""

    per_minute: int
    reserved_for_urgent: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.per_minute, bool) or not isinstance(self.per_minute, int) or self.per_minute < 1:
            raise ValueError("per_minute must be an int >= 1")
        if not 0 <= self.reserved_for_urgent < self.per_minute:
            raise ValueError("reserved_for_urgent must be >= 0 and below per_minute")

    def for_lane(self, urgent: bool) -> int:
        """The grants an acquire of this lane may find in the window."""
        return self.per_minute if urgent else self.per_minute - self.reserved_for_urgent


@runtime_checkable
class Limiter(Protocol):
    """What the send path needs. Waits are seconds; 0.0 means granted and consumed."""

    def acquire(self, bucket: str) -> float:
        """Take one slot: 0.0 if granted, else seconds to wait (nothing consumed)."""
        ...

    def acquire_many(self, buckets: Sequence[str], *, urgent: bool = False) -> float:
        """Take one slot in each bucket, all or nothing; same answer as :meth:`acquire`.
        ``urgent``: an urgent call's acquire (the module's doc: standby)."""
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


def urgent_bucket(shared: str) -> str:
    """The bucket urgent calls take beside ``shared``: their share of its limit."""
    return f"{URGENT_PREFIX}{shared}"


def _urgent_own(bucket: str) -> bool:
    return bucket.startswith(URGENT_PREFIX)


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
        self._standby_until: dict[str, float] = {}

    def acquire(self, bucket: str) -> float:
        return self.acquire_many((bucket,))

    def acquire_many(self, buckets: Sequence[str], *, urgent: bool = False) -> float:
        unique = tuple(dict.fromkeys(buckets))
        _check_buckets(self._limits, unique)
        with self._lock:
            now = self._clock()
            # The pauses first: the answer is the longest of the global one and the buckets' own.
            paused_s = max([0.0, *(self._bucket_paused_until.get(bucket, now) - now for bucket in unique)])
            if self._paused_until > now:
                return max(self._paused_until - now, paused_s)
            wait_s = max(paused_s, _MIN_WAIT_S) if paused_s > 0 else 0.0
            if not urgent:  # a normal call stands back while an urgent one waits for its bucket
                wait_s = max([wait_s, *(self._standby_until.get(bucket, now) - now for bucket in unique)])
            full_shared: dict[str, float] = {}
            own_full = False
            for bucket in unique:
                grants = self._grants[bucket]
                while grants and grants[0] <= now - WINDOW_S:
                    grants.popleft()
                limit = self._limits[bucket].for_lane(urgent)
                if len(grants) >= limit:
                    # the grant whose leaving frees a slot for this lane: the oldest, below a reserve
                    free_in_s = max(grants[len(grants) - limit] + WINDOW_S - now, _MIN_WAIT_S)
                    wait_s = max(wait_s, free_in_s)
                    if _urgent_own(bucket):
                        own_full = True
                    else:
                        full_shared[bucket] = free_in_s
            if wait_s > 0:
                if urgent and not own_full and paused_s == 0:
                    for bucket, free_in_s in full_shared.items():
                        until = now + free_in_s + STANDBY_MARGIN_S
                        self._standby_until[bucket] = max(self._standby_until.get(bucket, until), until)
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


# KEYS[1] the global pause key, then per bucket j its key, its own pause key and its standby key
# (KEYS[3j-1], KEYS[3j], KEYS[3j+1]); ARGV: now_ms, window_ms, member, urgent (1 or 0), the
# standby's margin in ms, then per bucket its limit and whether it is an urgent call's own bucket
# (ARGV[4+2j], ARGV[5+2j]). Returns 0 (granted in every bucket) or the wait in ms (nothing taken
# anywhere; an urgent call refused by shared buckets alone puts them on standby).
_ACQUIRE_LUA = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local urgent = ARGV[4] == '1'
local margin = tonumber(ARGV[5])
local buckets = (#KEYS - 1) / 3
local paused = 0
for j = 1, buckets do
  local bucket_paused_until = tonumber(redis.call('GET', KEYS[3 * j]) or '0')
  if bucket_paused_until > now then paused = math.max(paused, bucket_paused_until - now) end
end
local paused_until = tonumber(redis.call('GET', KEYS[1]) or '0')
if paused_until > now then return math.max(paused_until - now, paused) end
local wait = paused
if not urgent then
  for j = 1, buckets do
    local standby_until = tonumber(redis.call('GET', KEYS[3 * j + 1]) or '0')
    if standby_until > now then wait = math.max(wait, standby_until - now) end
  end
end
local own_full = false
local full_shared = {}
for j = 1, buckets do
  local key = KEYS[3 * j - 1]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  local limit = tonumber(ARGV[4 + 2 * j])
  if count >= limit then
    local freeing = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')
    local free_in = math.max(tonumber(freeing[2]) + window - now, 1)
    wait = math.max(wait, free_in)
    if ARGV[5 + 2 * j] == '1' then own_full = true else full_shared[#full_shared + 1] = {j, free_in} end
  end
end
if wait > 0 then
  if urgent and not own_full and paused == 0 then
    for _, full in ipairs(full_shared) do
      local standby_key = KEYS[3 * full[1] + 1]
      local standby_until = now + math.floor(full[2] + margin)
      if tonumber(redis.call('GET', standby_key) or '0') < standby_until then
        redis.call('SET', standby_key, standby_until, 'PX', standby_until - now + 1000)
      end
    end
  end
  return wait
end
for j = 1, buckets do
  redis.call('ZADD', KEYS[3 * j - 1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[3 * j - 1], window)
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

    def standby_key(self, bucket: str) -> str:
        """The Redis key of a bucket's standby (an urgent call waits for it)."""
        return self._prefix + STANDBY_KEY.format(bucket=bucket)

    def acquire_many(self, buckets: Sequence[str], *, urgent: bool = False) -> float:
        unique = tuple(dict.fromkeys(buckets))
        _check_buckets(self._limits, unique)
        keys = [self.pause_key()]
        for bucket in unique:
            keys += [self.key(bucket), self.pause_key(bucket), self.standby_key(bucket)]
        args: list[int | str] = [_now_ms(self._clock), int(WINDOW_S * 1000), secrets.token_hex(8),
                                 1 if urgent else 0, int(STANDBY_MARGIN_S * 1000)]
        for bucket in unique:
            args += [self._limits[bucket].for_lane(urgent), 1 if _urgent_own(bucket) else 0]
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
