"""What the send path needs from its process: settings, store, API client, limiter, caches.

Built once per worker process by ``workers/`` (or by a test, with fakes) and handed to
:func:`dispatcher.sending.send.send_notification`; nothing here knows about Celery.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from sqlalchemy.orm import Session, sessionmaker

from dispatcher.api import Inbox, RateLimited, WorkspaceClient
from dispatcher.api.errors import ApiStatusError, ServerError
from dispatcher.enqueue import Enqueuer
from dispatcher.errors import ConfigurationError, DispatcherError
from dispatcher.policy.backoff import backoff_s
from dispatcher.policy.breaker import Breaker, BreakerPlan, LocalBreaker, RedisBreaker
from dispatcher.policy.ratelimit import Limit, Limiter, LocalLimiter, RedisLimiter, route_bucket, urgent_bucket
from dispatcher.policy.readback import ReadBackPlan
from dispatcher.policy.retry import RetryPlan
from dispatcher.policy.routes import find_route_inbox
from dispatcher.settings import DEFAULT_WORKSPACE, Limits, Route, Settings, Timers
from dispatcher.store.account import TOP_LEVEL_INSTANCE
from dispatcher.store.models import utcnow

log = logging.getLogger(__name__)

ACCOUNT_BUCKET = "account"
SEARCH_BUCKET = "search"
# Sends before reads (docs/tracking.md): every status read of tracking (the consumer's, the
# read-backs', the deadline's) takes this bucket together with ``account``, all or nothing, and
# its limit is reads_fraction_of_api_requests of the account's. Why a bucket of its own rather
# than priorities or a reservation: the sliding windows already hold the guarantee with nothing
# new in them. Reads can never take more than their share in any minute, so sends always find the
# rest of the account's budget free, and sends, which take ``account`` alone, may use all of it
# while no read wants it. The reads the send path makes (looking for an earlier try's message
# before a resend, dispatcher/sending/recover.py) are part of a send and do not take it. A read
# the bucket refuses waits as for any limiter wait (``Wait``: the consumer's task, the read-backs
# and the deadline's read come back later).
READS_BUCKET = "reads"
# The budgets urgent calls take their share of, with an own bucket beside each (urgent_bucket).
# The status reads are normal calls: the reads bucket has no urgent share.
URGENT_SHARED_BUCKETS = (ACCOUNT_BUCKET, SEARCH_BUCKET)
# After a 429 the reads wait this many times the sends' pause, so the sends resume first.
READS_PAUSE_FACTOR = 2.0
INBOX_CACHE_TTL_S = 300.0
T = TypeVar("T")
INBOX_REFRESH_MIN_GAP_S = 5.0  # a route whose inbox is missing must not turn into a listInboxes storm


class InboxDirectory:
    """The account's inboxes, listed once and reused; listed again on a miss (at most every 5 s)."""

    def __init__(self, list_inboxes: Callable[[], list[Inbox]], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._list_inboxes = list_inboxes
        self._clock = clock
        self._inboxes: list[Inbox] = []
        self._listed_at: float | None = None
        self._lock = threading.Lock()

    def warm(self) -> None:
        """List the inboxes if none are cached or the cache is old; otherwise do nothing."""
        with self._lock:
            now = self._clock()
            if self._listed_at is None or now - self._listed_at > INBOX_CACHE_TTL_S:
                self._refresh(now)

    def cached(self, route: Route) -> Inbox | None:
        """The route's inbox from the cache only: no API call (safe inside a transaction)."""
        with self._lock:
            return find_route_inbox(route, self._inboxes)

    def resolve(self, route: Route) -> Inbox | None:
        with self._lock:
            now = self._clock()
            if self._listed_at is None or now - self._listed_at > INBOX_CACHE_TTL_S:
                self._refresh(now)
            inbox = find_route_inbox(route, self._inboxes)
            if inbox is None and now - (self._listed_at or 0.0) >= INBOX_REFRESH_MIN_GAP_S:
                self._refresh(now)
                inbox = find_route_inbox(route, self._inboxes)
            return inbox

    def _refresh(self, now: float) -> None:
        self._inboxes = self._list_inboxes()
        self._listed_at = now


@dataclass
class SendContext:
    settings: Settings
    api: WorkspaceClient
    sessions: sessionmaker[Session]
    limiter: Limiter
    inboxes: InboxDirectory
    plan: RetryPlan
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], datetime] = utcnow
    sleep: Callable[[float], None] = time.sleep
    max_inline_wait_s: float = 2.0  # a shorter limiter wait is slept through; a longer one retries the task
    enqueuer: Enqueuer | None = None  # publishes the fallback's send task; None: the sweep publishes it
    breaker: Breaker = field(default_factory=LocalBreaker)  # shared through Redis in workers (make_breaker)
    # This run sends an urgent notification (the send path sets it per run, docs/priorities.md):
    # its calls take urgent's share and come first to the limits.
    urgent: bool = False


def limits_of(settings: Settings) -> dict[str, Limit]:
    limits = {
        ACCOUNT_BUCKET: Limit(per_minute=settings.api_requests_per_minute,
                              reserved_for_urgent=urgent_reserve(settings.api_requests_per_minute, settings)),
        SEARCH_BUCKET: Limit(per_minute=settings.contact_searches_per_minute,
                             reserved_for_urgent=urgent_reserve(settings.contact_searches_per_minute, settings)),
        READS_BUCKET: Limit(per_minute=reads_per_minute(settings)),
    }
    for shared in URGENT_SHARED_BUCKETS:  # urgent calls' share of each (docs/priorities.md)
        limits[urgent_bucket(shared)] = Limit(per_minute=urgent_per_minute(limits[shared].per_minute, settings))
    for name, route in settings.routes.items():
        if route.max_per_minute is not None:
            limits[route_bucket(name)] = Limit(per_minute=route.max_per_minute)
    return limits


def urgent_reserve(shared_per_minute: int, limits: Limits) -> int:
    """The slots of a budget kept for urgent calls alone, rounded up (none of a budget of one)."""
    return min(math.ceil(limits.urgent_reserved_fraction * shared_per_minute), shared_per_minute - 1)


def urgent_per_minute(shared_per_minute: int, limits: Limits) -> int:
    """Urgent calls' share of a budget, rounded down: at least one a minute is left to normal ones
    (a budget of one a minute is urgent's to share: it cannot be split)."""
    share = math.floor(limits.urgent_fraction_of_api_requests * shared_per_minute)
    return max(1, min(share, shared_per_minute - 1)) if shared_per_minute > 1 else 1


def reads_per_minute(limits: Limits) -> int:
    """The status reads' limit: their share of the account's, rounded up (at least one a minute)."""
    return math.ceil(limits.reads_fraction_of_api_requests * limits.api_requests_per_minute)


def require_shared_limits(settings: Settings) -> None:
    """Refuse a deployment whose workers would each keep their own rate limits and breaker.

    With a Redis broker they share them through it, or through ``redis_url``. With another
    server broker (RabbitMQ, SQL) and no ``redis_url``, N workers would each send up to the
    whole workspace limit: N times what it allows. Only the embedded file broker, one machine
    and a handful of processes, runs with limits per process (docs/embedded-broker.md).
    """
    if settings.limiter_redis_url is None and not settings.broker_url.startswith("filesystem://"):
        raise ConfigurationError(
            "DISPATCHER_REDIS_URL (redis_url)",
            "is required when the broker is neither redis:// nor the embedded filesystem://; the workers share "
            "the workspace's rate limits and circuit breaker through it, and without it each worker would "
            "send up to the whole limit"
        )


def make_limiter(settings: Settings) -> Limiter:
    """Shared through Redis when there is one; per process in the embedded setup."""
    redis_url = settings.limiter_redis_url
    if redis_url is None:
        return LocalLimiter(limits_of(settings))
    import redis

    # Per account, as before: each workspace is an account, with its own buckets (docs/workspaces.md:
    # api_requests_per_minute is each workspace's; their sum must stay under the instance's limit).
    account = settings.account
    scope = f"{account.id}" if account.instance == TOP_LEVEL_INSTANCE else f"{account.instance}:{account.id}"
    return RedisLimiter(redis.Redis.from_url(redis_url), limits_of(settings), key_prefix=f"dispatcher:rl:{scope}:")


def make_breaker(settings: Settings, *, timeout_s: float | None = None) -> Breaker:
    """Shared through Redis when there is one (as the limiter); per process in the embedded setup.
    ``timeout_s``: how long a call to Redis may take (None: redis-py's default, no limit)."""
    plan = BreakerPlan(base_s=settings.breaker_base_s, cap_s=max(settings.breaker_cap_s, settings.breaker_base_s),
                       trip_after_server_errors=settings.breaker_after_server_errors)
    redis_url = settings.limiter_redis_url
    if redis_url is None:
        return LocalBreaker(plan)
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    return RedisBreaker(client, plan, key_prefix=_prefix("dispatcher:", settings))


def _prefix(base: str, settings: Settings) -> str:
    """Each workspace's own keys: two workspaces on one account ID (two instances) share nothing.
    The default workspace keeps the keys it always had."""
    if settings.workspace_name == DEFAULT_WORKSPACE:
        return f"{base}{settings.account_id}:"
    return f"{base}{settings.workspace_name}:{settings.account_id}:"


def readback_plan_of(timers: Timers) -> ReadBackPlan:
    return ReadBackPlan(first_after_s=timers.reconcile_after_s, max_interval_s=timers.reconcile_max_interval_s,
                        horizon_s=timers.reconcile_horizon_s)


def retry_plan_of(settings: Settings) -> RetryPlan:
    return RetryPlan(
        max_tries=settings.retry_max_tries,
        base_s=settings.retry_base_s,
        cap_s=settings.retry_cap_s,
        max_countdown_s=settings.retry_max_countdown_s,
    )


# -- API calls under the shared limits: the send path and tracking both call the workspace --


class Wait(DispatcherError):
    """Not now: try the notification again after ``delay_s`` (a limiter or another worker's claim)."""

    def __init__(self, delay_s: float, reason: str) -> None:
        self.delay_s = delay_s
        self.reason = reason
        super().__init__(f"wait {delay_s:.1f}s: {reason}")


def pause_after_429(limiter: Limiter, pause_s: float) -> None:
    """The workspace answered 429: every call waits ``pause_s``, the status reads twice as long,
    so the sends resume first. Each pause only ever lengthens."""
    limiter.pause(pause_s)
    limiter.pause(READS_PAUSE_FACTOR * pause_s, bucket=READS_BUCKET)


def buckets_of_call(buckets: tuple[str, ...], *, urgent: bool) -> tuple[str, ...]:
    """What one API call takes: ``account``, the given buckets, and for an urgent call its share's
    bucket beside each shared one (docs/priorities.md)."""
    taken = (ACCOUNT_BUCKET, *buckets)
    if urgent:
        taken += tuple(urgent_bucket(bucket) for bucket in taken if bucket in URGENT_SHARED_BUCKETS)
    return taken


def call_api(ctx: SendContext, call: Callable[[], T], *buckets: str) -> T:
    """Take the shared rate-limit slots for one API call, then make it.

    A call of an urgent run (``ctx.urgent``) takes urgent's share beside the shared buckets, and
    the limiter serves it before normal calls (docs/priorities.md).

    A call that takes :data:`READS_BUCKET` is a status read: its 429 pauses the limiter here, and
    the error goes on to the caller as before. Tracking turns a failed read into "unreadable" or a
    spent try and has no retry decision to pause with; the send path pauses from its own decision
    (``Decision.pause_s``, which grows with the tries)."""
    urgent = ctx.urgent
    taken = buckets_of_call(buckets, urgent=urgent)
    wait_s = ctx.limiter.acquire_many(taken, urgent=urgent)
    if wait_s > 0:
        if wait_s > ctx.max_inline_wait_s:
            raise Wait(wait_s, "rate limit")
        ctx.sleep(wait_s)
        wait_s = ctx.limiter.acquire_many(taken, urgent=urgent)
        if wait_s > 0:
            raise Wait(wait_s, "rate limit")
    try:
        answer = call()
    except RateLimited as error:
        ctx.breaker.answered()
        if READS_BUCKET in buckets:
            _pause_after_read_429(ctx, error)
        raise
    except ServerError:
        raise  # one more in the workspace's streak: the send path counts it, with its notification
    except ApiStatusError:
        ctx.breaker.answered()  # a 4xx: the workspace is up
        raise
    # The workspace answered: a streak of 5xx answers, if the breaker's gate saw one, ends here
    # (whichever notification's call it is); with no streak this costs nothing.
    ctx.breaker.answered()
    return answer


def _pause_after_read_429(ctx: SendContext, error: RateLimited) -> None:
    """A 429 to a status read. The workspace counts every call of the client address, not reads
    apart, so it pauses the sends too: a send made now would only draw the next 429 and spend one
    of its tries. The sends' pause is the Retry-After, else the first retry's backoff (a send's
    first 429 pauses as long); the reads' twice that."""
    pause_s = error.retry_after_s
    if pause_s is None:
        pause_s = backoff_s(0, base_s=ctx.plan.base_s, cap_s=ctx.plan.cap_s, rng=ctx.rng)
    pause_after_429(ctx.limiter, pause_s)
    log.info("429 to a status read (%s): sends pause %.1f s, reads %.1f s", error.operation, pause_s,
             READS_PAUSE_FACTOR * pause_s)
