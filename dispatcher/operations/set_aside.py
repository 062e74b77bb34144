"""Notifications set aside because their send task kept dying (``crash_loop``) or their workspace or
route left the configuration (``workspace_unconfigured``, ``route_unconfigured``), and their retry.

A send task that died ``send_max_runs`` times on one attempt (a killed worker, a bug that kills
its process) is not run again by the sweep: it would only die again, and every death may cost a
worker. It stays as it was, marked ``crash_loop`` with why (``dispatcher status``, ``dispatcher
list``), until an operator retries it once the cause is fixed: its runs count from zero, and the
sweep publishes it within ``sweep_interval_s``. Its attempt may have been in flight when the task
died, so the next run looks for that message before it sends anything.
"""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from dispatcher.errors import StateConflict, UnknownNotification
from dispatcher.lifecycle import moves
from dispatcher.store import queries as store
from dispatcher.store.models import utcnow
from dispatcher.store.record import NotificationRecord


def retry(sessions: sessionmaker[Session], event_id: str) -> NotificationRecord:
    """Run a notification set aside again. UnknownNotification when there is none under
    ``event_id``, StateConflict when it is not set aside (nothing is changed then)."""
    with sessions.begin() as session:
        notification = store.find_notification_by_event(session, event_id)
        if notification is None:
            raise UnknownNotification(event_id)
        if not moves.retry_set_aside(session, notification_id=notification.id, now=utcnow()):
            raise StateConflict(f"notification {event_id!r} is not set aside (it is {notification.state}); "
                                "only one set aside (crash_loop, workspace_unconfigured or route_unconfigured) is retried this way")
    with sessions() as session:
        notification = store.find_notification_by_event(session, event_id)
        assert notification is not None  # found above; notifications are only deleted settled, by retention
        return NotificationRecord.of(notification, store.attempts_of(session, notification.id))
