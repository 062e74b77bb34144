"""Accept a business event: validate it, store it once under its event ID, hand it to the queue.

Everything a bad request can get wrong is found here, before anything is stored or sent, and
named by its field. The same event handed over again with the same request returns the stored
notification; with a different request it is refused with :class:`EventConflict`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from dispatcher import tracing
from dispatcher.enqueue import Enqueuer
from dispatcher.errors import EventConflict, EventSpent, InvalidEvent, UnknownNotification
from dispatcher.intake.request import NotificationRequest, SendPayload
from dispatcher.lifecycle import moves
from dispatcher.lifecycle.states import NotificationState
from dispatcher.policy.quiet_hours import within_window
from dispatcher.queues import Priority, send_queue
from dispatcher.recipients.keys import contact_keys, keys_of_contact
from dispatcher.recipients.platform import MARKETING
from dispatcher.recipients.policy import needs_consent
from dispatcher.settings import ChannelKind, Route, Settings
from dispatcher.store import queries as store
from dispatcher.store import suppressions
from dispatcher.store.models import Notification, utcnow
from dispatcher.store.record import NotificationRecord


def check_request(request: NotificationRequest, settings: Settings, *, now: datetime) -> str | None:
    """Raise InvalidEvent naming the field when the request cannot be sent; return the fallback route."""
    route = _route(settings, request.route, field="route")
    fallback_name = request.fallback_route or route.fallback
    fallback = _route(settings, fallback_name, field="fallback_route") if fallback_name else None
    if fallback_name == request.route:
        raise InvalidEvent("fallback_route", "must differ from route")
    if request.template is not None:
        template = settings.template(request.template.name, request.template.language)
        if template is None:
            raise InvalidEvent("template.name", "is not in the template registry for template.language")
        if template.category != request.template.category:
            raise InvalidEvent("template.category", f"the registered category is {template.category}")
        if len(request.template.params) != template.body_params:
            raise InvalidEvent(
                "template.params", f"the template takes {template.body_params} body parameter(s), got {len(request.template.params)}"
            )
    for field, name, candidate in (("template", request.route, route), ("fallback_route", fallback_name, fallback)):
        if candidate is not None and request.template is None and _needs_template(candidate):
            raise InvalidEvent(field, "that route needs an approved template; free text is not allowed there")
        if candidate is not None:
            _check_reachable(request, candidate, name or "", field)
    if request.send_at is not None and request.send_at <= now:
        raise InvalidEvent("send_at", "must be in the future")
    return fallback_name


def workspace_settings(settings: Settings, workspace: str | None) -> Settings:
    """The settings of the workspace a request names (None: the default); InvalidEvent naming
    ``workspace`` when the deployment has no such workspace."""
    try:
        return settings.for_workspace(workspace)
    except KeyError:
        raise InvalidEvent("workspace", "names no configured workspace") from None


def _route(settings: Settings, name: str | None, *, field: str) -> Route:
    route = settings.routes.get(name or "")
    if route is None:
        known = ", ".join(sorted(settings.routes)) or "none"
        raise InvalidEvent(field, f"names no configured route (configured: {known})")
    return route


def _needs_template(route: Route) -> bool:
    # Until the window is known open (delivery tracking records incoming messages), a platform
    # route must be able to send a template.
    return route.template_required or route.channel is ChannelKind.MESSAGING_PLATFORM


def _check_reachable(request: NotificationRequest, route: Route, name: str, field: str) -> None:
    if route.channel in (ChannelKind.SMS, ChannelKind.MESSAGING_PLATFORM, ChannelKind.WEB_SESSION):
        if request.contact.phone_number is None:
            raise InvalidEvent("contact.phone_number", f"route {name!r} ({route.channel.value}) needs a phone number")
    if route.channel is ChannelKind.EMAIL and request.contact.email is None:
        raise InvalidEvent("contact.email", f"route {name!r} (email) needs an e-mail address")


def _check_volume(session: Session, request: NotificationRequest, settings: Settings, *, now: datetime) -> None:
    """Refuse bulk use of a capped route (the web-session channel is low volume only)."""
    route = settings.routes[request.route]
    if route.max_per_minute is None:
        return
    # Count and insert must be one step for concurrent intakes, or each counts the others' rows
    # too late (14-18 of 50 concurrent requests got through a cap of 10 on PostgreSQL).
    store.serialize_route_intake(session, request.route)
    recent = store.count_recent_on_route(session, request.route, since=now - timedelta(minutes=1),
                                         workspace=settings.workspace_name)
    if recent >= route.max_per_minute:
        raise InvalidEvent(
            "route", f"route {request.route!r} is low volume: at most {route.max_per_minute} notifications a minute"
        )


def _check_consent(session: Session, request: NotificationRequest, fallback_route: str | None, settings: Settings, *,
                   now: datetime) -> None:
    """A route that needs consent (web-session, contract rule 4) takes the request's ``consent_ref``
    (recorded here, as a keyed hash) or consent the host recorded before; else the request is refused."""
    needing = [name for name in (request.route, fallback_route)
               if name is not None and needs_consent(settings.routes[name], settings)]
    if not needing:
        return
    keys = keys_of_contact(request.contact, key=settings.hashing_key)
    channel = ChannelKind.WEB_SESSION.value
    if request.consent_ref is not None:
        suppressions.record_consent(session, account=settings.account, keys=keys, channel=channel,
                                    reference=store.event_key(request.consent_ref, key=settings.hashing_key), now=now)
    elif not suppressions.has_consent(session, account=settings.account, keys=keys, channel=channel):
        raise InvalidEvent("consent_ref", f"route {needing[0]!r} (web_session) sends only with the recipient's consent: "
                                          "give consent_ref, or record the consent first")


def category_of(request: NotificationRequest, settings: Settings) -> str:
    """The request's category; else ``marketing`` for a template approved as MARKETING; else the route's."""
    if request.category is not None:
        return request.category
    if request.template is not None and request.template.category == "MARKETING":
        return MARKETING
    return settings.routes[request.route].category


def priority_of(request: NotificationRequest, settings: Settings) -> Priority:
    """The request's priority, else its route's (docs/priorities.md)."""
    return request.priority or settings.routes[request.route].priority


def scheduled_for(request: NotificationRequest, settings: Settings, *, now: datetime) -> datetime | None:
    """When the notification goes out (None: now). Its ``send_at``, or now, unless that falls
    outside its route's send window: then the window's next opening, in the recipient's time zone
    (the route's, else the default, when the request names none)."""
    due = request.send_at.astimezone(UTC) if request.send_at is not None else None
    return within_window(due, request.contact.time_zone, settings.routes[request.route], settings, now=now)


def payload_of(request: NotificationRequest, settings: Settings) -> dict[str, object]:
    """What a send still needs; stored apart from the notification and deleted when done. With it,
    the contact's keys (keyed hashes, as the contact cache knows them): the send reads its cached
    contact and conversation in the statement that loads the payload (lifecycle.moves.load_and_count_run)."""
    return {**SendPayload.of(request).stored(),
            store.PAYLOAD_CONTACT_KEYS: contact_keys(request.contact, key=settings.hashing_key)}


def stage(session: Session, request: NotificationRequest, settings: Settings, *, now: datetime,
          accepting: bool = False) -> tuple[Notification, bool]:
    """Add the notification in the caller's transaction; return it and whether it is new.

    Used by :func:`accept` and by the transactional outbox, where the host owns the transaction.
    ``accepting``: the caller is :func:`accept`, which owns the transaction and publishes the
    send task right after its commit. The row is then stored as enqueued (the sweep leaves it
    alone; the outbox's rows wait for the sweep instead), and the insert needs no savepoint: a
    racing twin's conflict may undo the whole transaction, which :func:`accept` runs again.
    """
    existing = store.find_notification_by_event(session, request.event_id)
    if existing is not None:
        if existing.fingerprint != request.fingerprint():
            raise EventConflict(request.event_id)
        return existing, False
    if store.event_spent(session, request.event_id, key=settings.hashing_key, now=now):
        raise EventSpent(request.event_id)
    fallback_route = check_request(request, settings, now=now)
    _check_volume(session, request, settings, now=now)
    _check_consent(session, request, fallback_route, settings, now=now)
    notification = moves.new_notification(
        # in UTC, as the store gives it back: the record built from this row is the one status() reads
        send_at=scheduled_for(request, settings, now=now),
        event_id=request.event_id,
        fingerprint=request.fingerprint(),
        route=request.route,
        fallback_route=fallback_route,
        channel=settings.routes[request.route].channel.value,
        category=category_of(request, settings),
        workspace=settings.workspace_name,
        priority=priority_of(request, settings).value,
        created_at=now,
        updated_at=now,
        trace_parent=new_trace(request, settings),
    )
    if accepting:
        if notification.state == NotificationState.QUEUED:
            notification.enqueued_at = now
        store.add_notification(session, notification, payload_of(request, settings))
        return notification, True
    with session.begin_nested():  # a racing twin's insert fails here without undoing the host's work
        store.add_notification(session, notification, payload_of(request, settings))
    return notification, True


def new_trace(request: NotificationRequest, settings: Settings) -> str | None:
    """The new notification's trace (dispatcher.tracing): its root span, the hand-over; None while off."""
    return tracing.start_trace("dispatcher.notification", {
        "dispatcher.route": request.route, "dispatcher.workspace": settings.workspace_name,
        "dispatcher.channel": settings.routes[request.route].channel.value})


def accept(
    request: NotificationRequest,
    *,
    sessions: sessionmaker[Session],
    settings: Settings,
    enqueuer: Enqueuer,
    clock: Callable[[], datetime] = utcnow,
) -> NotificationRecord:
    """Store the event once and queue it; return its record (the existing one for a repeat)."""
    now = clock()
    try:
        with sessions.begin() as session:
            notification, new = stage(session, request, settings, now=now, accepting=True)
    except IntegrityError:
        # A twin handed over at the same moment won the insert: answer with its row.
        with sessions.begin() as session:
            notification, new = stage(session, request, settings, now=now, accepting=True)
    if not new:
        return status(sessions, request.event_id)
    # Stored as enqueued already: on the usual path nothing more is written. Should this process
    # die before the publish, the row is published by the sweep once stale (stale_after_s).
    queue = send_queue(notification.workspace, Priority(notification.priority))
    if notification.state == NotificationState.QUEUED and not enqueuer.enqueue_send([notification.id], queue=queue):
        with sessions.begin() as session:  # the broker refused: the next sweep publishes it
            store.forget_enqueued(session, [notification.id], marked_at=now)
        return status(sessions, request.event_id)  # that write changed updated_at
    # The record as stored: a new notification has no attempt yet (reading it back cost a
    # transaction and two queries per hand-over).
    return NotificationRecord.of(notification, [])


def status(sessions: sessionmaker[Session], event_id: str, workspace: str | None = None) -> NotificationRecord:
    """The record of ``event_id``; with ``workspace``, only when it is that workspace's."""
    with sessions() as session:
        notification = store.find_notification_by_event(session, event_id, workspace=workspace)
        if notification is None:
            raise UnknownNotification(event_id)
        return NotificationRecord.of(notification, store.attempts_of(session, notification.id))
