"""A host changes its mind before a notification is sent: cancel it, or move its time.

A cancel answers "cancelled" only once no message can follow: the notification's current attempt
is queued or not yet made, and the same transaction ends it failed and the notification
cancelled (:func:`dispatcher.lifecycle.moves.cancel`), so a worker's claim, which is a
compare-and-set on that attempt, loses. Otherwise it answers too late, with the state: a worker
holds the attempt and its message may exist. Cancelling a cancelled notification answers
cancelled again, so a host may repeat the call.

A reschedule moves a notification that is still scheduled (to its route's next send window opening
when the new time falls outside the window); its deadlines count from the new time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.errors import InvalidEvent, TooLate, UnknownNotification
from dispatcher.intake.request import SendPayload
from dispatcher.lifecycle import moves
from dispatcher.lifecycle.states import CANCELLABLE_NOTIFICATION_STATES, NotificationState
from dispatcher.policy.quiet_hours import within_window
from dispatcher.settings import Settings
from dispatcher.store import queries as store
from dispatcher.store.models import Notification, utcnow
from dispatcher.store.record import NotificationRecord

CANCEL_DETAIL = "cancelled by the host before it was sent; nothing was sent"


def cancel(sessions: sessionmaker[Session], event_id: str, *, workspace: str | None = None,
           clock: Callable[[], datetime] = utcnow) -> NotificationRecord:
    """Cancel the notification handed over as ``event_id``. UnknownNotification when there is
    none; TooLate (with its state) when a worker holds it or it has ended; nothing changes then."""
    now = clock()
    try:
        with sessions.begin() as session:
            notification = _find(session, event_id, workspace)
            if notification.state != NotificationState.CANCELLED:
                _cancel(session, notification, now=now)
    except moves.CancelLost:  # the notification moved between the two rows' moves: nothing was kept
        raise TooLate(event_id, _state_of(sessions, event_id), "cancel") from None
    return _record(sessions, event_id, workspace)


def _cancel(session: Session, notification: Notification, *, now: datetime) -> None:
    if notification.state not in CANCELLABLE_NOTIFICATION_STATES:
        raise TooLate(notification.event_id, notification.state, "cancel")
    if not moves.cancel(session, notification_id=notification.id, number=notification.current_attempt,
                        route=notification.route, channel=notification.channel or "unknown",
                        detail=CANCEL_DETAIL, now=now):
        session.refresh(notification)  # a worker claimed it meanwhile: answer with where it is now
        raise TooLate(notification.event_id, notification.state, "cancel")
    store.drop_payload(session, notification.id)  # nothing will be sent: the content and contact go now


def reschedule(sessions: sessionmaker[Session], settings: Settings, event_id: str, send_at: datetime, *,
               workspace: str | None = None, clock: Callable[[], datetime] = utcnow) -> NotificationRecord:
    """Send a scheduled notification at ``send_at`` (timezone-aware, in the future) instead, or at
    its route's next send window opening when that time falls outside the window. InvalidEvent
    names ``send_at`` when it is not; TooLate when the notification is no longer scheduled (its
    time came, or it was cancelled); UnknownNotification when there is none."""
    now = clock()
    if send_at.tzinfo is None or send_at.utcoffset() is None:
        raise InvalidEvent("send_at", "needs a time zone (for example 2026-12-01T09:00:00+01:00)")
    if send_at <= now:
        raise InvalidEvent("send_at", "must be in the future")
    with sessions.begin() as session:
        notification = _find(session, event_id, workspace)
        of_workspace = settings.for_workspace(notification.workspace) if notification.workspace in settings.workspaces \
            else settings
        route = of_workspace.routes.get(notification.route)
        if route is not None:
            send_at = within_window(send_at.astimezone(UTC), _time_zone_of(session, notification.id), route,
                                    of_workspace, now=now) or send_at
        if not moves.reschedule(session, notification_id=notification.id, send_at=send_at.astimezone(UTC), now=now):
            session.refresh(notification)  # its time came meanwhile, or it was cancelled: say where it is now
            raise TooLate(event_id, notification.state, "reschedule")
    return _record(sessions, event_id, workspace)


def _time_zone_of(session: Session, notification_id: int) -> str | None:
    """The recipient's time zone, from the stored request (None: gone, unreadable, or not given)."""
    stored = store.load_payload(session, notification_id)
    try:
        return SendPayload.model_validate(stored).contact.time_zone if stored is not None else None
    except ValidationError:
        return None


def _find(session: Session, event_id: str, workspace: str | None = None) -> Notification:
    notification = store.find_notification_by_event(session, event_id, workspace=workspace)
    if notification is None:
        raise UnknownNotification(event_id)
    return notification


def _state_of(sessions: sessionmaker[Session], event_id: str) -> str:
    with sessions() as session:
        return _find(session, event_id).state


def _record(sessions: sessionmaker[Session], event_id: str, workspace: str | None = None) -> NotificationRecord:
    with sessions() as session:
        notification = _find(session, event_id, workspace)
        return NotificationRecord.of(notification, store.attempts_of(session, notification.id))
