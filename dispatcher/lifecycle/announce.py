"""What the host is told: a move that changes a notification's state writes, in its own
transaction, the event an outcome callback delivers (a transactional outbox, the ``callbacks``
table; :mod:`dispatcher.callbacks` delivers it). Only when callbacks are on: a session factory made
with ``announce=True`` (:func:`dispatcher.store.db.session_factory`) says so in ``session.info``,
so a deployment without callbacks pays nothing.

One event per notification, type and attempt (a repeat of a move writes nothing more), numbered
per notification in the order they happen (``sequence``), carrying what the notification's row
says right after the move: never content or contact data.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, case, func, literal, select
from sqlalchemy.orm import Session

from dispatcher.lifecycle.states import NotificationState as N
from dispatcher.store.built_once import built_once
from dispatcher.store.db import ANNOUNCE_KEY, dialect_insert
from dispatcher.store.models import Attempt, Callback, Notification, UTCDateTime, table_of

PENDING = "pending"

# The states a host is told of, and the event type of each.
EVENT_OF_STATE: dict[str, str] = {
    N.ACCEPTED: "notification.accepted",
    N.SENT: "notification.sent",
    N.DELIVERED: "notification.delivered",
    N.READ: "notification.read",
    N.FALLING_BACK: "notification.fell_back",
    N.FAILED: "notification.failed",
    N.CANCELLED: "notification.cancelled",
}

NOTIFICATIONS = table_of(Notification)
CALLBACKS = table_of(Callback)
ATTEMPTS = table_of(Attempt)
_COLUMNS = ("notification_id", "event_id", "route", "workspace", "type", "attempt", "state", "channel", "error_kind", "sequence",
            "occurred_at", "status", "tries", "next_try_at")


def announce(session: Session, notification_id: int, *, now: datetime) -> None:
    """Write the event of the notification's state as it now is, if the host is told of that state
    and it was not told of it for this attempt already. Call it after a move that won."""
    if not session.info.get(ANNOUNCE_KEY):
        return
    session.execute(_ANNOUNCE(session), {"notification_id": notification_id, "now": now})


@built_once
def _ANNOUNCE(dialect: str) -> Any:  # noqa: N802 (a statement, named as the constant it is)
    """The event of the notification's state as one ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``,
    built once (SQLAlchemy compiles no ``ON CONFLICT`` statement from its cache)."""
    n = NOTIFICATIONS
    # One past the highest: the move holds the notification's row lock, so two moves never number alike
    # (a unique index would refuse it), and retention keeps a notification's callbacks while it exists.
    sequence = (select(func.coalesce(func.max(CALLBACKS.c.sequence), 0) + 1)
                .where(CALLBACKS.c.notification_id == n.c.id).scalar_subquery())
    at = bindparam("now", type_=UTCDateTime())
    # the current attempt's channel: right after a fallback decision the notification still shows the first one's
    channel = func.coalesce(select(ATTEMPTS.c.channel).where(ATTEMPTS.c.notification_id == n.c.id,
                                                             ATTEMPTS.c.number == n.c.current_attempt).scalar_subquery(),
                            n.c.channel)
    source = select(
        n.c.id, n.c.event_id, n.c.route, n.c.workspace, case(EVENT_OF_STATE, value=n.c.state), n.c.current_attempt, n.c.state,
        channel, n.c.error_kind, sequence, at, literal(PENDING), literal(0), at,
    ).where(n.c.id == bindparam("notification_id"), n.c.state.in_(list(EVENT_OF_STATE)))
    return (dialect_insert(dialect)(CALLBACKS).from_select(list(_COLUMNS), source)
            .on_conflict_do_nothing(index_elements=["notification_id", "type", "attempt"]))
