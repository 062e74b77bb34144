"""How much the deployment may spend: the workspace's call budgets and their shares, and how many
times one piece of work is tried before it is set aside."""

from __future__ import annotations

from pydantic import Field

from dispatcher.settings.checks import Concern


class Limits(Concern):
    # The workspace's rate limits, shared by every worker (in Redis: Storage.limiter_redis_url).
    api_requests_per_minute: int = Field(default=2400, gt=0)  # the service allows 3,000 per client address
    contact_searches_per_minute: int = Field(default=90, gt=0)  # the service allows 100 per account
    # Sends before reads: tracking's status reads (webhooks without a status, read-backs, the
    # deadline's read) may take at most this fraction (0 < f <= 1) of api_requests_per_minute, so
    # that reads after an evening batch never fill the budget new sends need; sends may use all of
    # it. A 429 pauses the reads twice as long as the sends (docs/tracking.md, "Sends before reads").
    reads_fraction_of_api_requests: float = Field(default=0.2, gt=0, le=1)
    # Urgent first, normal never starved (docs/priorities.md): a normal send stands back while an
    # urgent one waits for the same budget, but urgent sends take at most this fraction of each
    # budget (API requests, contact searches) in any minute, so normal sends always keep the rest.
    urgent_fraction_of_api_requests: float = Field(default=0.8, gt=0, lt=1)
    # And this fraction of each budget is kept for urgent sends alone (rounded up: 48 of 2,400
    # requests, 2 of 90 searches): normal sends that spend a minute's budget in its first seconds
    # leave room for an urgent one, which otherwise waits for the window to slide.
    urgent_reserved_fraction: float = Field(default=0.02, ge=0, lt=0.5)
    # A send task that died this many times on one attempt (a crash loop: a killed worker, a bug that
    # kills the process) is set aside as crash_loop until an operator retries it; apart from
    # retry_max_tries, which counts only calls that reached the workspace.
    send_max_runs: int = Field(default=20, gt=0, le=1000)
    retry_max_tries: int = Field(default=12, gt=0, le=100)
    # A webhook delivery the consumer failed to apply this many times is set aside (outcome
    # "set_aside", with its last error): no single event can stop the others.
    delivery_max_tries: int = Field(default=10, gt=0)
    # A workspace that answers the calls of this many different notifications in a row (every
    # worker's together) with a 5xx is down: the breaker trips as for a refused token, with
    # error_kind "unavailable" (docs/priorities.md).
    breaker_after_server_errors: int = Field(default=5, gt=0, le=1000)
