"""``retry``: run a notification again. Two cases, one command:

* set aside as ``crash_loop`` (its send task kept dying), ``workspace_unconfigured`` or
  ``route_unconfigured`` (its workspace or route left the configuration): it runs again from where it was
  (:mod:`dispatcher.operations.set_aside`);
* ``failed``: one new attempt on the notification's own route, same event, counted in its record
  (the ``retry_failed`` move). Its fallback decision stays made: a retry that fails too ends the
  notification again, and no second fallback is sent. The content was deleted when the
  notification failed (nothing outlives the send), so the host hands the same request over
  again with the retry; the stored fingerprint must match it. A recipient who opted out since is
  still refused by the claim, as for any send.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from dispatcher.enqueue import Enqueuer
from dispatcher.errors import EventConflict, StateConflict, UnknownNotification
from dispatcher.intake.accept import payload_of
from dispatcher.intake.request import NotificationRequest
from dispatcher.lifecycle import moves
from dispatcher.lifecycle.states import NotificationState
from dispatcher.operations import set_aside
from dispatcher.queues import Priority, send_queue
from dispatcher.settings import Settings
from dispatcher.store import queries as store
from dispatcher.store.models import utcnow
from dispatcher.store.record import NotificationRecord


def retry(sessions: sessionmaker[Session], settings: Settings, enqueuer: Enqueuer, event_id: str,
          request: NotificationRequest | None = None, *, workspace: str | None = None,
          clock: Callable[[], datetime] = utcnow) -> NotificationRecord:
    """Run ``event_id`` again: set aside, or failed. UnknownNotification when there is none;
    StateConflict when it is neither, or when it failed and its content is gone and no
    ``request`` came with the retry; EventConflict when ``request`` is not the one handed over."""
    with sessions() as session:
        notification = store.find_notification_by_event(session, event_id, workspace=workspace)
        if notification is None:
            raise UnknownNotification(event_id)
        state, error_kind, of_workspace = notification.state, notification.error_kind, notification.workspace
    if state != NotificationState.FAILED and error_kind in moves.SET_ASIDE_KINDS:
        return set_aside.retry(sessions, event_id)
    if state != NotificationState.FAILED:
        raise StateConflict(f"notification {event_id!r} is {state}; only a failed one, or one set aside "
                            "(crash_loop, workspace_unconfigured or route_unconfigured), is retried")
    chosen = settings.for_workspace(of_workspace) if of_workspace in settings.workspaces else settings
    return _retry_failed(sessions, chosen, enqueuer, event_id, request, now=clock())


def _retry_failed(sessions: sessionmaker[Session], settings: Settings, enqueuer: Enqueuer, event_id: str,
                  request: NotificationRequest | None, *, now: datetime) -> NotificationRecord:
    with sessions.begin() as session:
        notification = store.find_notification_by_event(session, event_id)
        assert notification is not None  # found above; only retention deletes, and not an unsettled row
        if request is not None and request.fingerprint() != notification.fingerprint:
            raise EventConflict(event_id)
        kept = store.load_payload(session, notification.id) is not None
        if not kept and request is None:
            raise StateConflict(f"notification {event_id!r} failed and its content was deleted then; retry it "
                                "with the same request it was handed over with")
        route = settings.routes.get(notification.route)
        if route is None:
            raise StateConflict(f"notification {event_id!r}: its route {notification.route!r} is no longer configured")
        if not moves.retry_failed(session, notification_id=notification.id, route=notification.route,
                                  channel=route.channel.value, now=now):
            raise StateConflict(f"notification {event_id!r} is no longer failed")
        if not kept:
            assert request is not None
            store.add_payload(session, notification.id, payload_of(request, settings))
        store.mark_enqueued(session, [notification.id], now=now)
        notification_id = notification.id
        queue = send_queue(notification.workspace, Priority(notification.priority))
    if not enqueuer.enqueue_send([notification_id], queue=queue):
        with sessions.begin() as session:  # the broker refused: the next sweep publishes it
            store.forget_enqueued(session, [notification_id], marked_at=now)
    with sessions() as session:
        found = store.find_notification_by_event(session, event_id)
        assert found is not None
        return NotificationRecord.of(found, store.attempts_of(session, found.id))
