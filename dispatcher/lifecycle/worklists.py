"""Work lists: the rows in a state that a sweep, the backlog gate or the outcome path acts on
(the moves that act on them are :mod:`dispatcher.lifecycle.moves`).

These questions name the lifecycle's states, so they live beside the states, not in
:mod:`dispatcher.store`: the store knows tables and rows, never what a state means, and imports
nothing of the lifecycle (tests/unit/test_layout.py).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, or_, select, true, update
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


def count_waiting_for_a_worker(session: Session) -> int:
    """Notifications queued and not yet taken by a worker: the send backlog (scheduled ones wait
    for their time instead)."""
    query = select(func.count()).select_from(Notification).where(Notification.state == NotificationState.QUEUED)
    return int(session.scalar(query) or 0)

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
    lost = Notification.task_started.is_(True) if not send_queue_empty else true()
    query = (
        select(Notification.id, Notification.workspace, Notification.priority)
        .where(
            or_(
                (Notification.state == NotificationState.SCHEDULED) & (Notification.send_at <= now),
                (Notification.state.in_(SENDABLE_NOTIFICATION_STATES))
                # set aside (its send task kept dying): an operator's retry publishes it again
                & or_(Notification.error_kind.is_(None), Notification.error_kind.not_in(sorted(SET_ASIDE_KINDS)))
                & or_(
                    Notification.enqueued_at.is_(None),
                    (Notification.next_try_at.is_not(None)) & (Notification.next_try_at <= now),
                    (Notification.next_try_at.is_(None)) & (Notification.enqueued_at < stale_before) & lost,
                ),
            )
        )
        # "urgent" sorts after "normal": descending takes the urgent lane's rows first
        .order_by(Notification.priority.desc(), Notification.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [DueRow(row.id, row.workspace, row.priority) for row in session.execute(query)]

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
    due = (
        select(Attempt.id)
        .join(Notification, Notification.id == Attempt.notification_id)
        .where(
            Attempt.state.in_(sorted(states)),  # the read-back policy's (dispatcher.policy.readback)
            Attempt.message_id.is_not(None),
            Attempt.next_read_at <= now,
            Attempt.number == Notification.current_attempt,
            Notification.workspace == workspace,  # read back through its own workspace's API
            or_(Attempt.purpose.in_(sorted(AFTER_DECISION_PURPOSES)), Notification.fallback_decision.is_(None)),
        )
        .order_by(Attempt.next_read_at)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        due = due.with_for_update(of=Attempt, skip_locked=True)
    ids = list(session.scalars(due))
    if not ids:
        return []
    rows = session.execute(
        update(ATTEMPTS).where(ATTEMPTS.c.id.in_(ids)).values(next_read_at=hold_until)
        .returning(ATTEMPTS.c.id, ATTEMPTS.c.message_id, ATTEMPTS.c.conversation_id, ATTEMPTS.c.state,
                   ATTEMPTS.c.accepted_at, ATTEMPTS.c.channel)
    ).all()
    order = {attempt_id: position for position, attempt_id in enumerate(ids)}
    return sorted((DueRead(row.id, row.message_id, row.conversation_id, row.state, row.accepted_at, row.channel)
                   for row in rows),
                  key=lambda read: order[read.attempt_id])

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
    rows = session.execute(
        select(Attempt.notification_id, Attempt.id, Attempt.accepted_at, Attempt.message_id, Attempt.purpose)
        .join(Notification, Notification.id == Attempt.notification_id)
        .where(
            Attempt.number == Notification.current_attempt,
            Attempt.purpose.not_in(sorted(AFTER_DECISION_PURPOSES)),
            Attempt.route == route,
            Notification.workspace == workspace,
            Attempt.state.in_([AttemptState.ACCEPTED, AttemptState.SENT]),
            Attempt.accepted_at < accepted_before,
            Notification.fallback_decision.is_(None),
        )
        .order_by(Attempt.accepted_at)
        .limit(limit)
    )
    return [LateAttempt(*row) for row in rows]

def undecided_failures(session: Session, *, failed_before: datetime | None, limit: int,
                       workspace: str = "default",
                       notification_id: int | None = None) -> list[tuple[int, str, str | None, str | None]]:
    """Failed current attempts whose consequence is missing: a first or template attempt with no
    fallback decision, or a fallback or retry whose notification was not ended; recorded before
    ``failed_before`` (None: whenever), of one notification when ``notification_id`` is given.
    (notification id, attempt purpose, error kind, detail)"""
    rows = session.execute(
        select(Attempt.notification_id, Attempt.purpose, Attempt.error_kind, Attempt.error_detail)
        .join(Notification, Notification.id == Attempt.notification_id)
        .where(
            Attempt.state == AttemptState.FAILED,
            Attempt.updated_at < failed_before if failed_before is not None else true(),
            Attempt.notification_id == notification_id if notification_id is not None else true(),
            Attempt.number == Notification.current_attempt,
            or_(
                Attempt.purpose.not_in(sorted(AFTER_DECISION_PURPOSES)) & Notification.fallback_decision.is_(None),
                Attempt.purpose.in_(sorted(AFTER_DECISION_PURPOSES)),
            ),
            # Open notifications only. Failed or cancelled ones are ended (a cancel fails the current
            # attempt and needs no decision: else every sweep would take it again, and a hundred
            # cancels would crowd the real repairs out); a delivered or read one never has a failed
            # current attempt (a failure report after delivery is ignored). Naming the few open
            # states, not excluding the ended ones, lets the state index find them: a store's
            # failed attempts are kept for its whole retention (700,000 at 10 million rows, read
            # in 2.3 s every pass before, issue 20's 10x run).
            Notification.state.in_(sorted(UNSETTLED_NOTIFICATION_STATES)),
            Notification.workspace == workspace,
        )
        .order_by(Attempt.updated_at)
        .limit(limit)
    ).all()
    return [(row[0], row[1], row[2], row[3]) for row in rows]
