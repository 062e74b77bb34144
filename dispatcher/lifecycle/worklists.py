"""Work lists: the rows in a state that a sweep, the backlog gate or the outcome path acts on
(the moves that act on them are :mod:`dispatcher.lifecycle.moves`).

These questions name the lifecycle's states, so they live beside the states, not in
:mod:`dispatcher.store`: the store knows tables and rows, never what a state means, and imports
nothing of the lifecycle (tests/unit/test_layout.py).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, or_, select, true, update
from sqlalchemy.orm import Session

from dispatcher.lifecycle.moves import SET_ASIDE_KINDS
from dispatcher.lifecycle.states import (
    AFTER_DECISION_PURPOSES,
    SENDABLE_NOTIFICATION_STATES,
    UNSETTLED_NOTIFICATION_STATES,
    AttemptState,
    NotificationState,
)
from dispatcher.store.models import Attempt, Notification, table_of

ATTEMPTS = table_of(Attempt)
NOTIFICATIONS = table_of(Notification)


def count_waiting_for_a_worker(session: Session) -> int:
    """Notifications queued and not yet taken by a worker: the send backlog (scheduled ones wait
    for their time instead)."""
    return int(session.scalar(_WAITING_FOR_A_WORKER) or 0)


# Built once, as every statement of this module: a sweep runs them every few seconds (the
# simulation thousands of times a run), and building a statement costs more than running it.
_WAITING_FOR_A_WORKER = select(func.count()).select_from(NOTIFICATIONS).where(
    NOTIFICATIONS.c.state == NotificationState.QUEUED)


@dataclass(frozen=True, slots=True)
class DueRow:
    """A row the sweep hands to its lane's queue (dispatcher.queues.send_queue)."""

    id: int
    workspace: str
    priority: str


def due_for_enqueue(session: Session, *, now: datetime, stale_before: datetime, limit: int,
                    send_queue_empty: bool) -> list[DueRow]:
    """Rows a sweep should hand (again) to the queue, urgent ones first (docs/priorities.md).

    New rows never enqueued (an outbox row, or an enqueue that failed), scheduled rows now due,
    rows whose long retry wait is over, and rows whose task was lost:

    - started (a run touched the row) and untouched since ``stale_before``: the run's lease
      lapsed. A run that dies is given back by the broker (late acks), so this is a task that
      ended by an exception and was acknowledged while the row stayed sendable, or a run
      stuck past the lease;
    - published (or due after a countdown) before ``stale_before`` and not started, only when
      ``send_queue_empty``: the broker's send queue held no task as the sweep began, so this
      row's task is not waiting there. It is held by a worker about to start it (the prefetch
      is one task a process), or lost: the publisher died between its commit and its publish,
      or a broker without persistence restarted. While the queue holds tasks, a row waiting in
      a backlog keeps its one task, however long the backlog takes.

    Sending the same ID twice is harmless (the send path is idempotent and guarded by
    compare-and-set), but a backlog republished every ``stale_after_s`` filled the broker
    (issue 44).

    On PostgreSQL the rows are locked and rows another sweep holds are skipped (``SKIP LOCKED``),
    so sweeps in several processes take disjoint batches; SQLite runs one writer at a time anyway.
    """
    rows = session.execute(_due_statement(send_queue_empty), {"now": now, "stale_before": stale_before, "limit": limit})
    return [DueRow(row.id, row.workspace, row.priority) for row in rows]


@functools.cache
def _due_statement(send_queue_empty: bool) -> Any:
    n = NOTIFICATIONS.c
    now, stale_before = bindparam("now", type_=n.send_at.type), bindparam("stale_before", type_=n.enqueued_at.type)
    lost = n.task_started.is_(True) if not send_queue_empty else true()
    return (
        select(n.id, n.workspace, n.priority)
        .where(
            or_(
                (n.state == NotificationState.SCHEDULED) & (n.send_at <= now),
                (n.state.in_(sorted(SENDABLE_NOTIFICATION_STATES)))
                # set aside (its send task kept dying): an operator's retry publishes it again
                & or_(n.error_kind.is_(None), n.error_kind.not_in(sorted(SET_ASIDE_KINDS)))
                & or_(
                    n.enqueued_at.is_(None),
                    (n.next_try_at.is_not(None)) & (n.next_try_at <= now),
                    (n.next_try_at.is_(None)) & (n.enqueued_at < stale_before) & lost,
                ),
            )
        )
        # "urgent" sorts after "normal": descending takes the urgent lane's rows first
        .order_by(n.priority.desc(), n.id)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
    )


@dataclass(frozen=True)
class DueRead:
    """An attempt taken for a read back by one sweep (its next read pushed past the hold)."""

    attempt_id: int
    message_id: int
    conversation_id: int | None
    state: str
    accepted_at: datetime | None
    channel: str


def take_due_reads(session: Session, *, now: datetime, limit: int, hold_until: datetime, states: Collection[str],
                   workspace: str = "default") -> list[DueRead]:
    """Take up to ``limit`` attempts due for a read back, oldest first, for this sweep alone: their
    next read moves to ``hold_until`` in the same statement's transaction, and on PostgreSQL rows
    another sweep holds are skipped (``FOR UPDATE SKIP LOCKED``), so sweeps in several processes
    read each attempt once. The caller schedules the real next read (or hands the attempt back)."""
    postgres = session.get_bind().dialect.name == "postgresql"
    due = _due_reads_statement(tuple(sorted(states)), postgres)
    ids = list(session.scalars(due, {"now": now, "workspace": workspace, "limit": limit}))
    if not ids:
        return []
    rows = session.execute(_HOLD_READS, {"ids": ids, "hold_until": hold_until}).all()
    order = {attempt_id: position for position, attempt_id in enumerate(ids)}
    return sorted((DueRead(row.id, row.message_id, row.conversation_id, row.state, row.accepted_at, row.channel)
                   for row in rows),
                  key=lambda read: order[read.attempt_id])


@functools.cache
def _due_reads_statement(states: tuple[str, ...], postgres: bool) -> Any:
    a, n = ATTEMPTS.c, NOTIFICATIONS.c
    due = (
        select(a.id)
        .join(NOTIFICATIONS, n.id == a.notification_id)
        .where(
            a.state.in_(states),  # the read-back policy's (dispatcher.policy.readback)
            a.message_id.is_not(None),
            a.next_read_at <= bindparam("now", type_=a.next_read_at.type),
            a.number == n.current_attempt,
            n.workspace == bindparam("workspace"),  # read back through its own workspace's API
            or_(a.purpose.in_(sorted(AFTER_DECISION_PURPOSES)), n.fallback_decision.is_(None)),
        )
        .order_by(a.next_read_at)
        .limit(bindparam("limit"))
    )
    return due.with_for_update(of=ATTEMPTS, skip_locked=True) if postgres else due


_HOLD_READS = (
    update(ATTEMPTS).where(ATTEMPTS.c.id.in_(bindparam("ids", expanding=True)))
    .values(next_read_at=bindparam("hold_until", type_=ATTEMPTS.c.next_read_at.type))
    .returning(ATTEMPTS.c.id, ATTEMPTS.c.message_id, ATTEMPTS.c.conversation_id, ATTEMPTS.c.state,
               ATTEMPTS.c.accepted_at, ATTEMPTS.c.channel)
)


@dataclass(frozen=True)
class LateAttempt:
    """A current attempt past its route's delivery deadline, with no fallback decided yet."""

    notification_id: int
    attempt_id: int
    accepted_at: datetime
    message_id: int | None
    purpose: str  # a first send, or its resend as a template (the only ones a deadline decides)


def attempts_past_deadline(session: Session, *, route: str, accepted_before: datetime, limit: int,
                           workspace: str = "default") -> list[LateAttempt]:
    """Current attempts through ``route`` accepted before the cut-off, still not delivered, with no
    fallback decided (the first send, or its resend as a template), oldest first."""
    rows = session.execute(_PAST_DEADLINE, {"route": route, "workspace": workspace, "accepted_before": accepted_before,
                                            "limit": limit})
    return [LateAttempt(*row) for row in rows]


_PAST_DEADLINE = (
    select(ATTEMPTS.c.notification_id, ATTEMPTS.c.id, ATTEMPTS.c.accepted_at, ATTEMPTS.c.message_id, ATTEMPTS.c.purpose)
    .join(NOTIFICATIONS, NOTIFICATIONS.c.id == ATTEMPTS.c.notification_id)
    .where(
        ATTEMPTS.c.number == NOTIFICATIONS.c.current_attempt,
        ATTEMPTS.c.purpose.not_in(sorted(AFTER_DECISION_PURPOSES)),
        ATTEMPTS.c.route == bindparam("route"),
        NOTIFICATIONS.c.workspace == bindparam("workspace"),
        ATTEMPTS.c.state.in_([AttemptState.ACCEPTED.value, AttemptState.SENT.value]),
        ATTEMPTS.c.accepted_at < bindparam("accepted_before", type_=ATTEMPTS.c.accepted_at.type),
        NOTIFICATIONS.c.fallback_decision.is_(None),
    )
    .order_by(ATTEMPTS.c.accepted_at)
    .limit(bindparam("limit"))
)


def undecided_failures(session: Session, *, failed_before: datetime | None, limit: int,
                       workspace: str = "default",
                       notification_id: int | None = None) -> list[tuple[int, str, str | None, str | None]]:
    """Failed current attempts whose consequence is missing: a first or template attempt with no
    fallback decision, or a fallback or retry whose notification was not ended; recorded before
    ``failed_before`` (None: whenever), of one notification when ``notification_id`` is given.
    (notification id, attempt purpose, error kind, detail)"""
    statement = _undecided_statement(failed_before is not None, notification_id is not None)
    rows = session.execute(statement, {"failed_before": failed_before, "notification_id": notification_id,
                                       "workspace": workspace, "limit": limit}).all()
    return [(row[0], row[1], row[2], row[3]) for row in rows]


@functools.cache
def _undecided_statement(before: bool, of_one: bool) -> Any:
    """:func:`undecided_failures`'s statement, for a cut-off or none and one notification or all."""
    a, n = ATTEMPTS.c, NOTIFICATIONS.c
    return (
        select(a.notification_id, a.purpose, a.error_kind, a.error_detail)
        .join(NOTIFICATIONS, n.id == a.notification_id)
        .where(
            a.state == AttemptState.FAILED.value,
            a.updated_at < bindparam("failed_before", type_=a.updated_at.type) if before else true(),
            a.notification_id == bindparam("notification_id") if of_one else true(),
            a.number == n.current_attempt,
            or_(
                a.purpose.not_in(sorted(AFTER_DECISION_PURPOSES)) & n.fallback_decision.is_(None),
                a.purpose.in_(sorted(AFTER_DECISION_PURPOSES)),
            ),
            # Open notifications only. Failed or cancelled ones are ended (a cancel fails the current
            # attempt and needs no decision: else every sweep would take it again, and a hundred
            # cancels would crowd the real repairs out); a delivered or read one never has a failed
            # current attempt (a failure report after delivery is ignored). Naming the few open
            # states, not excluding the ended ones, lets the state index find them: a store's
            # failed attempts are kept for its whole retention (700,000 at 10 million rows, read
            # in 2.3 s every pass before, issue 20's 10x run).
            n.state.in_(sorted(UNSETTLED_NOTIFICATION_STATES)),
            n.workspace == bindparam("workspace"),
        )
        .order_by(a.updated_at)
        .limit(bindparam("limit"))
    )
