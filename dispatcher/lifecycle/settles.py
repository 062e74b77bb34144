"""How long a notification took to settle, told once its transaction committed.

A notification *settles* when its current attempt is delivered or read, or when it ends failed:
the moves that do so note it here (:func:`note`). Just before the transaction commits, one read of
the noted notifications' rows (by primary key) keeps those the move really left settled (their
``updated_at`` is the move's own time: a notification that did not follow its attempt, one settled
before, is left out) and what is measured: from when the notification was due (its hand-over, or
its ``send_at`` when it was scheduled later, so a reminder booked a day ahead is not a day late)
to the move. Only after the commit are they handed to the observer: a transaction that rolls back
tells nothing.

A move that moves nothing further (read after delivered) is not noted: a notification settles once.
The measuring is switched on per session factory (:func:`measure_settles`, where a process serves
metrics); elsewhere ``note`` costs a dictionary lookup and no read is made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, event, select
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.lifecycle.states import AttemptState, NotificationState
from dispatcher.store.models import Notification, table_of

__all__ = ["SETTLED_BY_OUTCOME", "Settled", "measure_settles", "note", "settles_now"]

NOTIFICATIONS = table_of(Notification)
_OBSERVER = "settles_observer"  # in session.info: where settles go (set by measure_settles)
_NOTED = "settles_noted"  # notification ID -> the time of the move that settled it, this transaction
_READY = "settles_ready"  # read before the commit, told after it

# The attempt states an outcome settles a notification in, and the ends a notification settles in.
SETTLED_BY_OUTCOME = frozenset({AttemptState.DELIVERED, AttemptState.READ})
_SETTLED_ENDS = frozenset({NotificationState.DELIVERED, NotificationState.READ, NotificationState.FAILED})

_NOTED_ROWS = select(NOTIFICATIONS.c.id, NOTIFICATIONS.c.route, NOTIFICATIONS.c.created_at, NOTIFICATIONS.c.send_at,
                     NOTIFICATIONS.c.state, NOTIFICATIONS.c.updated_at).where(
    NOTIFICATIONS.c.id.in_(bindparam("ids", expanding=True)))


@dataclass(frozen=True, slots=True)
class Settled:
    """A notification settled, ``seconds`` after it was due, on ``route`` (a configured name)."""

    route: str
    state: str
    seconds: float


Observer = Callable[[Settled], None]


def measure_settles(sessions: sessionmaker[Session], observe: Observer) -> None:
    """From now on, sessions of ``sessions`` tell ``observe`` of each notification their committed
    transactions settled."""
    sessions.configure(info={**sessions.kw.get("info", {}), _OBSERVER: observe})
    event.listen(sessions, "before_commit", _read_noted)
    event.listen(sessions, "after_commit", _tell)
    event.listen(sessions, "after_rollback", _forget)


def note(session: Session, notification_id: int, *, now: datetime) -> None:
    """A move that may have settled the notification at ``now`` won (the read before the commit
    checks that the notification itself followed)."""
    if _OBSERVER in session.info:
        session.info.setdefault(_NOTED, {})[notification_id] = now


def settles_now(current: AttemptState, new: AttemptState) -> bool:
    """Whether an outcome moving the current attempt from ``current`` to ``new`` settles its
    notification: delivered or read, from a state before either."""
    return new in SETTLED_BY_OUTCOME and current not in SETTLED_BY_OUTCOME


def _read_noted(session: Session) -> None:
    noted: dict[int, datetime] | None = session.info.pop(_NOTED, None)
    if not noted:
        return
    ready: list[Settled] = session.info.setdefault(_READY, [])
    for row in session.execute(_NOTED_ROWS, {"ids": sorted(noted)}):
        if row.state in _SETTLED_ENDS and row.updated_at == noted[row.id]:
            due = max(row.created_at, row.send_at) if row.send_at is not None else row.created_at
            ready.append(Settled(route=row.route, state=row.state, seconds=max((row.updated_at - due).total_seconds(), 0.0)))


def _tell(session: Session) -> None:
    ready: list[Settled] = session.info.pop(_READY, [])
    observe: Observer = session.info[_OBSERVER]
    for settled in ready:
        observe(settled)


def _forget(session: Session) -> None:
    session.info.pop(_NOTED, None)
    session.info.pop(_READY, None)
