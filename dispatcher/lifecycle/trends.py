"""The overview's trends over the last hour, read from the store into typed records: per minute,
the notifications handed over, the messages sent, the notifications settled and the backlog; and
the settle latency's p50 and p99 by route. Identifiers' routes, states and times only: nothing
here reads a payload or a contact.

Which column says what (docs/dashboard.md, "Trends"):

- handed over: ``notifications.created_at``;
- sent: ``attempts.accepted_at``, one per message the service took (a fallback is a second one);
- settled (delivered, read or failed) and ended (those, or cancelled): the ``status_at`` of the
  notification's current attempt, written by the move that took it there; for one read after it
  was delivered, the time its delivery was applied (``applied_statuses``) when the store has it.
  The store keeps no settle time of its own, and ``notifications.updated_at`` moves again on a read.

Every statement is bounded to the hour by an index (``created_at``, ``attempts.status_at``) or to
the few notifications not ended (the state index), and the percentiles are taken here, in Python,
from those rows: the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased

from dispatcher.lifecycle.states import SETTLED_NOTIFICATION_STATES, AttemptState, NotificationState
from dispatcher.store.models import AppliedStatus, Attempt, Notification

MINUTES = 60
MINUTE = timedelta(minutes=1)
# Reached delivered, read or failed: what the settled series and the latency count. A cancelled
# one ends too (it leaves the backlog), but nothing was sent, so it has no settle latency.
SETTLED = frozenset({NotificationState.DELIVERED, NotificationState.READ, NotificationState.FAILED})
ENDED = SETTLED_NOTIFICATION_STATES  # delivered, read, failed, cancelled: nothing more will happen


@dataclass(frozen=True)
class MinuteCounts:
    """One minute of the hour: ``start`` to ``start`` + 1 minute."""

    start: datetime
    handed_over: int  # notifications created in the minute
    sent: int  # messages the service accepted in the minute
    settled: int  # notifications that reached delivered, read or failed in the minute
    backlog: int  # notifications handed over and not ended at the minute's end (the last: now)


@dataclass(frozen=True)
class RouteLatency:
    """From hand-over to settled, for the notifications of ``route`` that settled in the hour."""

    route: str
    settled: int
    p50_s: float  # nearest rank: the value at ceil(0.50 * settled) in ascending order
    p99_s: float  # nearest rank: the value at ceil(0.99 * settled)


@dataclass(frozen=True)
class Trends:
    minutes: list[MinuteCounts]  # MINUTES of them, oldest first; the last is the current minute
    latencies: list[RouteLatency]  # by route

    @property
    def since(self) -> datetime:
        return self.minutes[0].start

    @property
    def until(self) -> datetime:
        return self.minutes[-1].start + MINUTE


@dataclass(frozen=True)
class Life:
    """A notification as the trends see it: its route, when it was handed over, its state now
    and when it ended (None: it has not)."""

    route: str
    handed_over: datetime
    state: str
    ended: datetime | None


def hour_of(now: datetime) -> tuple[datetime, datetime]:
    """The hour the trends show: the MINUTES whole minutes up to and including ``now``'s."""
    until = now.replace(second=0, microsecond=0) + MINUTE
    return until - MINUTES * MINUTE, until


def trends(session: Session, *, now: datetime) -> Trends:
    """The trends of the hour up to ``now``: three reads, each bounded to the hour by an index."""
    since, _ = hour_of(now)
    lives = handed_over_since(session, since) + ended_since(session, since)
    return summarise(since=since, lives=lives, sent=sent_since(session, since),
                     open_before=open_before(session, since))


def handed_over_since(session: Session, since: datetime) -> list[Life]:
    """The notifications handed over from ``since`` on (``ix_notifications_created_at``)."""
    return _lives(session, Notification.created_at >= since, attempt_needed=False)


def ended_since(session: Session, since: datetime) -> list[Life]:
    """The notifications handed over before ``since`` that have ended and whose current attempt
    moved from ``since`` on: those that ended in the hour, and a few read in the hour that had
    ended before it. The ones handed over in the hour are :func:`handed_over_since`'s.

    Only the attempt's time is asked of the store, so ``ix_attempts_status_at`` drives the read:
    a condition on the notification's state or hand-over (true of most rows) could lead a planner
    without statistics (SQLite's) to walk that index instead. The few others are left out here."""
    return [life for life in _lives(session, Attempt.status_at >= since, attempt_needed=True)
            if life.handed_over < since and life.ended is not None]


def sent_since(session: Session, since: datetime) -> list[datetime]:
    """When each message accepted from ``since`` on was accepted. An attempt's ``status_at`` is its
    acceptance or later, so the status_at index bounds the read to the hour's moves."""
    return list(session.scalars(select(Attempt.accepted_at)
                                .where(Attempt.status_at >= since, Attempt.accepted_at >= since)))


def open_before(session: Session, since: datetime) -> int:
    """The notifications handed over before ``since`` and not ended now: in the backlog all hour.
    Counted by the state index (few at any moment: the sweeps read them the same way)."""
    return session.scalar(select(func.count()).select_from(Notification)
                          .where(Notification.state.in_(sorted(frozenset(NotificationState) - ENDED)),
                                 Notification.created_at < since)) or 0


def _lives(session: Session, *where: Any, attempt_needed: bool) -> list[Life]:
    """The lives of the notifications ``where`` says, with their current attempt (by its unique
    notification_id and number: an inner join when ``where`` reads the attempt, so its index drives
    the read) and the delivery applied to its message (by the applied statuses' key)."""
    delivered = aliased(AppliedStatus)
    rows = session.execute(
        select(Notification.route, Notification.created_at, Notification.state, Notification.updated_at,
               Attempt.status_at, delivered.applied_at)
        .select_from(Notification)
        .join(Attempt, and_(Attempt.notification_id == Notification.id,
                            Attempt.number == Notification.current_attempt), isouter=not attempt_needed)
        .outerjoin(delivered, and_(delivered.workspace == Attempt.workspace, delivered.message_id == Attempt.message_id,
                                   delivered.status == AttemptState.DELIVERED.value))
        .where(*where)).tuples()
    return [Life(route, created_at, state, ended_at(state, updated_at, status_at, delivered_at))
            for route, created_at, state, updated_at, status_at, delivered_at in rows]



def ended_at(state: str, updated_at: datetime, status_at: datetime | None, delivered_at: datetime | None) -> datetime | None:
    """When a notification in ``state`` ended (None: not ended): its current attempt's last move;
    the earlier of that and its recorded delivery for one read; its own last move when its current
    attempt recorded no time."""
    if state not in ENDED:
        return None
    if status_at is None:
        return updated_at
    if state == NotificationState.READ and delivered_at is not None:
        return min(status_at, delivered_at)
    return status_at


def summarise(*, since: datetime, lives: Sequence[Life], sent: Sequence[datetime], open_before: int) -> Trends:
    """The minutes and latencies of the hour from ``since``, from what was read. Pure."""
    starts = [since + index * MINUTE for index in range(MINUTES)]
    handed = _per_minute(since, [life.handed_over for life in lives if life.handed_over >= since])
    settled_lives = [life for life in lives if life.state in SETTLED and life.ended is not None and life.ended >= since]
    settled = _per_minute(since, [life.ended for life in settled_lives if life.ended is not None])
    accepted = _per_minute(since, list(sent))
    minutes = [MinuteCounts(start, handed[index], accepted[index], settled[index],
                            open_before + _backlog(lives, start + MINUTE))
               for index, start in enumerate(starts)]
    by_route: dict[str, list[float]] = {}
    for life in settled_lives:
        assert life.ended is not None
        by_route.setdefault(life.route, []).append((life.ended - life.handed_over).total_seconds())
    latencies = [RouteLatency(route, len(seconds), percentile(seconds, 50), percentile(seconds, 99))
                 for route, seconds in sorted(by_route.items())]
    return Trends(minutes, latencies)


def _per_minute(since: datetime, times: Iterable[datetime]) -> list[int]:
    counts = [0] * MINUTES
    for at in times:
        index = int((at - since) // MINUTE)
        if 0 <= index < MINUTES:
            counts[index] += 1
    return counts


def _backlog(lives: Iterable[Life], at: datetime) -> int:
    """Handed over before ``at`` and not ended by then (the store keeps no past backlog: this is
    derived from the hand-over and end times)."""
    return sum(1 for life in lives if life.handed_over < at and (life.ended is None or life.ended >= at))


def percentile(values: Sequence[float], rank: int) -> float:
    """The nearest-rank percentile: the smallest value with at least ``rank`` % of them at or below it."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(rank / 100 * len(ordered))) - 1]
