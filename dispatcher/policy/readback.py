"""When to read an unconfirmed attempt back from the message list, and when to stop. Pure.

A stock workspace never retries a webhook, so an outcome whose webhook was lost is only learned by
reading the message list. The first read comes ``first_after_s`` after the attempt's last news;
then the reads back off with the attempt's age (a quarter of it), never further apart than
``max_interval_s``, so an outcome that happens within the horizon is learned at most that long
after it happened. ``horizon_s`` after acceptance the attempt is no longer read: a message
delivered by then may still be read by its recipient, but reading forever costs one call per
message per period. Settled attempts (read, failed) are never read again, nor an attempt whose
fallback has been decided (the caller leaves those out).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from dispatcher.lifecycle.states import AttemptState

READ_BACK_STATES = frozenset({AttemptState.ACCEPTED, AttemptState.SENT, AttemptState.DELIVERED})


@dataclass(frozen=True, slots=True)
class ReadBackPlan:
    first_after_s: float = 60.0
    max_interval_s: float = 300.0
    horizon_s: float = 3600.0


def next_read_at(*, state: AttemptState, accepted_at: datetime, now: datetime, plan: ReadBackPlan) -> datetime | None:
    """When the attempt is read back next, after news at ``now``; None: never again."""
    if state not in READ_BACK_STATES:
        return None
    end = accepted_at + timedelta(seconds=plan.horizon_s)
    if now >= end:
        return None
    age_s = (now - accepted_at).total_seconds()
    interval_s = min(max(plan.first_after_s, age_s / 4), plan.max_interval_s)
    return min(now + timedelta(seconds=interval_s), end)
