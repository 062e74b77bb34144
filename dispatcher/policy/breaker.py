"""A circuit breaker per workspace: when it refuses our token or cannot be reached, every worker waits.

Sending on while the workspace refuses the token (401/403) or does not answer (no connection)
only makes a storm of failing requests and burns every notification's tries; a person must act
(fix the token) or the network must come back. So the first such failure *trips* the breaker:
for a while no worker calls the workspace, notifications wait (visibly, with the reason), and
when the while is over exactly one worker *probes* with a real call. A success closes the breaker
and everyone carries on; a failure trips it again, for longer (exponential backoff with jitter,
capped). Nothing is lost: a notification fails with that reason only at its send deadline.

A workspace that answers but is down (issue 45: 5xx to every call) trips it too, once calls for
``plan.trip_after_server_errors`` different notifications in a row were answered with a 5xx, every
worker's calls counted together (:meth:`Breaker.server_error`), with ``error_kind`` ``unavailable``.
A 5xx among answers is the retry policy's, not a reason to stop every worker: any other answer
ends the streak (:meth:`Breaker.answered`, which costs nothing while there is no streak). And one
notification whose calls keep failing counts once: its own retries end it (``tries_exhausted``),
the workspace goes on for the others. While it is open, its notifications wait without holding a
worker: a run checks the breaker before anything else.

Two implementations, like the rate limiter: :class:`RedisBreaker` (shared by every worker on
every host) and :class:`LocalBreaker` (one process, the embedded setup).

:func:`pause_reason` says which errors trip it; :func:`dispatcher.policy.retry.decide` turns them
into a ``pause_workspace`` decision. Times are unix seconds.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dispatcher.api import errors as api_errors

if TYPE_CHECKING:
    import redis

__all__ = ["Breaker", "BreakerPlan", "LocalBreaker", "Pause", "Probe", "RedisBreaker", "pause_reason"]

PROBE_LEASE_S = 30.0  # a probing worker that died frees the probe after this
_CONNECT_FAILURES = frozenset({"ConnectError", "ConnectTimeout"})


def pause_reason(error: BaseException) -> tuple[str, str] | None:
    """``(error_kind, error_detail)`` for an error that means "stop calling this workspace", else None.

    The detail is plain words for an operator: what happened and what to check. It names the
    setting, never its value.
    """
    if isinstance(error, api_errors.AccessDenied):
        status = getattr(error, "status_code", None)
        if status == 403:
            return "auth", "the API token has no access to the account (HTTP 403): check DISPATCHER_ACCOUNT_ID and the token's access"
        return "auth", "the workspace refused the API token (HTTP 401): check DISPATCHER_API_TOKEN"
    if isinstance(error, api_errors.NotSent) and error.detail in _CONNECT_FAILURES:
        return "unreachable", f"the workspace did not answer at its address ({error.detail}): check DISPATCHER_API_URL and the network"
    return None


UNAVAILABLE = "unavailable"
UNAVAILABLE_DETAIL = ("the workspace answered the calls of {count} notifications in a row with a server error "
                      "(HTTP 5xx): it is down or overloaded; one worker tries again after the pause")
STREAK_TTL_S = 300.0  # a streak nobody adds to for this long is forgotten (Redis)


@dataclass(frozen=True, slots=True)
class BreakerPlan:
    """Backoff of the pauses: ``base_s`` after the first failure, doubling, at most ``cap_s``.
    ``trip_after_server_errors``: 5xx answers in a row that trip it."""

    base_s: float = 5.0
    cap_s: float = 120.0
    trip_after_server_errors: int = 5

    def pause_s(self, trips: int, rng: random.Random) -> float:
        """The pause after the ``trips``-th failure in a row: full at the cap, with 20 % jitter below."""
        return float(min(self.base_s * 2 ** max(trips - 1, 0), self.cap_s) * rng.uniform(0.8, 1.0))


@dataclass(frozen=True, slots=True)
class Pause:
    """The breaker is open: call nothing before ``until``."""

    reason: str  # the error_kind: "auth" or "unreachable"
    detail: str
    until: float


@dataclass(frozen=True, slots=True)
class Probe:
    """The breaker was open and this caller may make the one call that tests it: close it on success."""


class Breaker(Protocol):
    def gate(self) -> Pause | Probe | None:
        """None: closed, call freely. A Probe: this caller makes the test call. A Pause: wait."""
        ...

    def trip(self, reason: str, detail: str) -> tuple[Pause, bool]:
        """Open (or keep open, for longer) after a failure; True when this call opened it."""
        ...

    def close(self) -> bool:
        """A call got through; True when the breaker was open (the pause is over)."""
        ...

    def peek(self) -> Pause | None:
        """The pause while the breaker is open (its ``until`` may be past: a probe is due), else
        None. Only reads: an onlooker (the dashboard) never takes the probe."""
        ...

    def server_error(self, notification_id: int) -> tuple[Pause, bool] | None:
        """A call for ``notification_id`` was answered with a 5xx: one more in the streak unless that
        notification is in it already. At ``trip_after_server_errors`` notifications in a row the
        breaker trips (``unavailable``): the trip's answer, else None."""
        ...

    def answered(self) -> None:
        """A call was answered otherwise: the streak of 5xx answers, if any, ends."""
        ...


class LocalBreaker:
    """One process's breaker (the embedded setup): thread-safe, nothing shared."""

    def __init__(self, plan: BreakerPlan = BreakerPlan(), *, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None) -> None:
        self.plan, self._clock, self._rng = plan, clock, rng or random.Random()
        self._lock = threading.Lock()
        self._pause: Pause | None = None
        self._trips = 0
        self._probe_until = 0.0
        self._streak: set[int] = set()

    def gate(self) -> Pause | Probe | None:
        with self._lock:
            if self._pause is None:
                return None
            now = self._clock()
            if now < self._pause.until or now < self._probe_until:
                return self._pause if now < self._pause.until else Pause(self._pause.reason, self._pause.detail, self._probe_until)
            self._probe_until = now + PROBE_LEASE_S
            return Probe()

    def trip(self, reason: str, detail: str) -> tuple[Pause, bool]:
        with self._lock:
            opened = self._pause is None
            self._trips += 1
            self._pause = Pause(reason, detail, self._clock() + self.plan.pause_s(self._trips, self._rng))
            self._probe_until = 0.0
            return self._pause, opened

    def close(self) -> bool:
        with self._lock:
            was_open = self._pause is not None
            self._pause, self._trips, self._probe_until = None, 0, 0.0
            self._streak.clear()
            return was_open

    def peek(self) -> Pause | None:
        with self._lock:
            return self._pause

    def server_error(self, notification_id: int) -> tuple[Pause, bool] | None:
        with self._lock:
            self._streak.add(notification_id)
            count = len(self._streak)
        if count < self.plan.trip_after_server_errors:
            return None
        return self.trip(UNAVAILABLE, UNAVAILABLE_DETAIL.format(count=count))

    def answered(self) -> None:
        with self._lock:
            self._streak.clear()


_TRIP_LUA = """
local trips = redis.call('HINCRBY', KEYS[1], 'trips', 1)
local pause_ms = math.min(tonumber(ARGV[2]) * 2 ^ (trips - 1), tonumber(ARGV[3])) * tonumber(ARGV[4])
local until_ms = tonumber(ARGV[1]) + math.floor(pause_ms)
redis.call('HSET', KEYS[1], 'reason', ARGV[5], 'detail', ARGV[6], 'until', until_ms)
redis.call('PEXPIRE', KEYS[1], math.floor(pause_ms) + 86400000)
redis.call('DEL', KEYS[2])
return {trips, until_ms}
"""


# KEYS[1] the breaker's hash; ARGV: the streak's life in ms, the notification's ID. The streak is
# the hash's "streak" field (the count, which every gate reads) and a "5xx:<id>" field for each
# notification in it; a hash that holds no pause is kept only that long after the last 5xx (an open
# breaker keeps its own expiry).
_STREAK_LUA = """
local count
if redis.call('HSETNX', KEYS[1], '5xx:' .. ARGV[2], 1) == 1 then
  count = redis.call('HINCRBY', KEYS[1], 'streak', 1)
else
  count = tonumber(redis.call('HGET', KEYS[1], 'streak') or '0')
end
if redis.call('HEXISTS', KEYS[1], 'until') == 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return count
"""

# KEYS[1] the breaker's hash: the streak's fields go (the pause, if any, stays).
_END_STREAK_LUA = """
local fields = {'streak'}
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(name, 1, 4) == '5xx:' then fields[#fields + 1] = name end
end
redis.call('HDEL', KEYS[1], unpack(fields))
return #fields - 1
"""


class RedisBreaker:
    """The breaker every worker shares through Redis: one hash (reason, detail, until, trips) and a
    probe key taken with ``SET NX``, so after a pause exactly one worker calls the workspace."""

    def __init__(self, client: redis.Redis, plan: BreakerPlan = BreakerPlan(), *, key_prefix: str,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None) -> None:
        self.plan, self._client, self._clock, self._rng = plan, client, clock, rng or random.Random()
        self._key, self._probe_key = key_prefix + "breaker", key_prefix + "breaker:probe"
        self._trip = client.register_script(_TRIP_LUA)
        self._count_server_error = client.register_script(_STREAK_LUA)
        self._end_streak = client.register_script(_END_STREAK_LUA)
        self._streak_seen = False  # the last gate (or this process) saw a streak: the next answer ends it

    def gate(self) -> Pause | Probe | None:
        pause = self.peek()
        if pause is None:
            return None
        now = self._clock()
        if now < pause.until:
            return pause
        if self._client.set(self._probe_key, b"1", nx=True, px=int(PROBE_LEASE_S * 1000)):
            return Probe()
        return Pause(pause.reason, pause.detail, now + PROBE_LEASE_S / 2)  # another worker is probing

    def trip(self, reason: str, detail: str) -> tuple[Pause, bool]:
        jitter = self._rng.uniform(0.8, 1.0)
        trips, until_ms = self._trip(keys=[self._key, self._probe_key], args=[
            int(self._clock() * 1000), int(self.plan.base_s * 1000), int(self.plan.cap_s * 1000), jitter, reason, detail])
        return Pause(reason, detail, int(until_ms) / 1000.0), int(trips) == 1

    def close(self) -> bool:
        self._streak_seen = False
        return bool(self._client.delete(self._key, self._probe_key))

    def server_error(self, notification_id: int) -> tuple[Pause, bool] | None:
        count = int(self._count_server_error(keys=[self._key], args=[int(STREAK_TTL_S * 1000), notification_id]))
        self._streak_seen = True
        if count < self.plan.trip_after_server_errors:
            return None
        return self.trip(UNAVAILABLE, UNAVAILABLE_DETAIL.format(count=count))

    def answered(self) -> None:
        # The streak is a field of the breaker's hash, which every run's gate reads anyway: a run
        # that saw one (or made one) ends it, whichever process began it; on the happy path this
        # costs no call.
        if self._streak_seen:
            self._end_streak(keys=[self._key])
            self._streak_seen = False

    def peek(self) -> Pause | None:
        fields: list[Any] = self._client.hmget(self._key, ["reason", "detail", "until", "streak"])  # type: ignore[assignment]
        self._streak_seen = fields[3] is not None
        if fields[2] is None:
            return None
        reason, detail = (value.decode() if isinstance(value, bytes) else str(value) for value in fields[:2])
        return Pause(reason, detail, int(fields[2]) / 1000.0)
