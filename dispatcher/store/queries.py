"""Every query the paths need, one named function each.

Reads, and the writes that move no state (caches, times, payloads). Every state change is one of
the lifecycle's named moves (:mod:`dispatcher.lifecycle.moves`), compare-and-set each. Callers
own the transaction (``with sessions.begin()``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Table, bindparam, delete, exists, func, or_, select, text, update
from sqlalchemy.orm import Session

from dispatcher.store.account import Account, of_account
from dispatcher.store.built_once import BuiltOnce, built_once
from dispatcher.store.db import dialect_insert
from dispatcher.store.models import (
    AppliedStatus,
    Attempt,
    ContactInbox,
    ConversationLink,
    KnownContact,
    Notification,
    Payload,
    ServiceWindow,
    SpentEvent,
    WebhookDelivery,
    table_of,
    utcnow,
)

# The send path runs these for every notification: Core statements on the tables skip the ORM's
# per-statement bookkeeping, and a prebuilt one skips rebuilding its expression each time.
NOTIFICATIONS = table_of(Notification)
ATTEMPTS = table_of(Attempt)
PAYLOADS = table_of(Payload)

_CURRENT = ATTEMPTS.alias("current_attempt_row")
LOAD_FOR_SEND = (  # what a send reads of its notification (and, on PostgreSQL, lifecycle.moves.load_and_count_run)
    select(
        NOTIFICATIONS.c.id,
        NOTIFICATIONS.c.state,
        NOTIFICATIONS.c.route,
        NOTIFICATIONS.c.fallback_route,
        NOTIFICATIONS.c.fallback_decision,
        NOTIFICATIONS.c.current_attempt,
        NOTIFICATIONS.c.created_at,
        NOTIFICATIONS.c.send_at,
        NOTIFICATIONS.c.category,
        NOTIFICATIONS.c.priority,
        _CURRENT.c.route.label("attempt_route"),  # None until the first attempt's row exists
        _CURRENT.c.purpose.label("attempt_purpose"),
        _CURRENT.c.state.label("attempt_state"),
        PAYLOADS.c.body,
    )
    .select_from(
        NOTIFICATIONS.outerjoin(PAYLOADS, PAYLOADS.c.notification_id == NOTIFICATIONS.c.id)
        .outerjoin(_CURRENT, (_CURRENT.c.notification_id == NOTIFICATIONS.c.id)
                   & (_CURRENT.c.number == NOTIFICATIONS.c.current_attempt))
    )
    .where(NOTIFICATIONS.c.id == bindparam("notification_id"))
)
def identity_key(*, key: bytes, identifier: str | None = None, phone_number: str | None = None,
                 email: str | None = None) -> str:
    """A stable key for a contact identity: a keyed hash (HMAC-SHA256, the settings' hashing key),
    so neither the phone number nor anything that could be enumerated back to it is stored. An
    e-mail address is lower-cased first (suppressions by e-mail match whatever case a host sends)."""
    if identifier is not None:
        kind, value = "identifier", identifier
    elif phone_number is not None:
        kind, value = "phone", phone_number
    elif email is not None:
        kind, value = "email", email.strip().lower()
    else:
        raise ValueError("identity_key needs an identifier, a phone number or an e-mail address")
    return hmac.new(key, f"{kind}\0{value}".encode(), hashlib.sha256).hexdigest()


def event_key(event_id: str, *, key: bytes) -> str:
    """A keyed hash of an event ID, kept once its notification is purged (nothing to enumerate)."""
    return hmac.new(key, event_id.encode(), hashlib.sha256).hexdigest()


def event_spent(session: Session, event_id: str, *, key: bytes, now: datetime) -> bool:
    """Whether the event was handed over before and its notification purged within the horizon."""
    spent_until = session.scalar(select(SpentEvent.spent_until).where(SpentEvent.event_key == event_key(event_id, key=key)))
    return spent_until is not None and spent_until > now


def content_hash(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


def _insert_ignoring_conflict(session: Session, model: type[Any], values: dict[str, Any]) -> None:
    """INSERT that leaves an existing row alone: the first writer wins, the others read its value."""
    session.execute(_insert_ignoring_conflict_statement(table_of(model), tuple(values))(session), values)


@functools.cache
def _insert_ignoring_conflict_statement(table: Table, columns: tuple[str, ...]) -> BuiltOnce:
    """:func:`_insert_ignoring_conflict`'s statement for a table and its given columns, built once."""
    return built_once(lambda dialect: dialect_insert(dialect)(table)
                      .values({column: bindparam(column) for column in columns}).on_conflict_do_nothing())


# --- notifications --------------------------------------------------------------------------


def find_notification_by_event(session: Session, event_id: str, *, workspace: str | None = None) -> Notification | None:
    """The notification handed over as ``event_id``; with ``workspace``, only when it is that
    workspace's (a host's scoped token reaches nothing else)."""
    query = select(Notification).where(Notification.event_id == event_id)
    if workspace is not None:
        query = query.where(Notification.workspace == workspace)
    return session.scalars(query).one_or_none()


def load_notification(session: Session, notification_id: int) -> Notification | None:
    return session.get(Notification, notification_id)


def add_notification(session: Session, notification: Notification, payload_body: dict[str, Any]) -> Notification:
    """Add a new notification and its payload; the unique event_id refuses a second one at flush."""
    session.add(notification)
    session.flush()
    session.add(Payload(notification_id=notification.id, body=payload_body))
    session.flush()
    return notification


def add_payload(session: Session, notification_id: int, payload_body: dict[str, Any]) -> None:
    """Keep a payload again for a notification whose payload was dropped (a host's retry brings it)."""
    session.add(Payload(notification_id=notification_id, body=payload_body))
    session.flush()


def serialize_route_intake(session: Session, route: str) -> None:
    """Hold the route's intake lock until the transaction ends: a capped route's count and insert
    then run one request at a time, across processes. PostgreSQL: a transaction-scoped advisory
    lock on the route's name. SQLite: nothing to do, its write transactions begin IMMEDIATE."""
    if session.get_bind().dialect.name == "postgresql":
        lock_id = int.from_bytes(hashlib.sha256(f"route-intake:{route}".encode()).digest()[:8], "big", signed=True)
        session.execute(select(func.pg_advisory_xact_lock(lock_id)))


def count_recent_on_route(session: Session, route: str, *, since: datetime, workspace: str = "default") -> int:
    query = select(func.count()).select_from(Notification).where(
        Notification.route == route, Notification.created_at >= since, Notification.workspace == workspace
    )
    return int(session.scalar(query) or 0)


def mark_enqueued(session: Session, notification_ids: Iterable[int], *, now: datetime) -> None:
    """A send task is (about to be) published for each row: queued, not started, as of ``now``."""
    ids = list(notification_ids)
    if ids:
        session.execute(
            update(Notification).where(Notification.id.in_(ids))
            .values(enqueued_at=now, next_try_at=None, task_started=False)
        )


def forget_enqueued(session: Session, notification_ids: Iterable[int], *, marked_at: datetime) -> None:
    """The publish of rows marked enqueued at ``marked_at`` failed: the next sweep takes them again
    (a row some task touched since is left as that task left it)."""
    ids = list(notification_ids)
    if ids:
        session.execute(update(Notification).where(Notification.id.in_(ids), Notification.enqueued_at == marked_at)
                        .values(enqueued_at=None))


def defer(session: Session, notification_id: int, *, at: datetime) -> None:
    """A long wait: the sweep hands the row to the queue again at ``at`` (no broker countdown)."""
    session.execute(update(Notification).where(Notification.id == notification_id).values(next_try_at=at))


def expect_run(session: Session, notification_id: int, *, at: datetime) -> None:
    """The row's next task waits in the broker (a retry countdown) until ``at``: a published task
    not started, due then. The sweep counts it as lost only ``stale_after_s`` past ``at``, and only
    while the send queue is empty: the retry's message may wait in the queue behind a backlog (on
    Redis and RabbitMQ a worker holds it, unacknowledged, only once it reached the queue's head),
    and a second task would spend a try and race the first."""
    session.execute(update(NOTIFICATIONS).where(NOTIFICATIONS.c.id == notification_id)
                    .values(enqueued_at=at, task_started=False))


def touch_for_run(session: Session, notification_id: int, *, now: datetime) -> None:
    """A task is working on the row now: it holds the row's run lease, which the sweep finds
    lapsed ``stale_after_s`` after this touch (the claim of a createMessage call touches it too)."""
    session.execute(
        update(NOTIFICATIONS).where(NOTIFICATIONS.c.id == notification_id)
        .values(next_try_at=None, enqueued_at=now, task_started=True)
    )


def add_payloads(session: Session, bodies: dict[int, dict[str, Any]]) -> None:
    """Store many notifications' payloads (by notification ID) in one executemany."""
    if bodies:
        session.execute(PAYLOADS.insert(), [{"notification_id": notification_id, "body": body}
                                            for notification_id, body in bodies.items()])


def stored_events(session: Session, event_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """The events among ``event_ids`` stored already: their fingerprint and state."""
    if not event_ids:
        return {}
    rows = session.execute(select(Notification.event_id, Notification.fingerprint, Notification.state)
                           .where(Notification.event_id.in_(list(event_ids))))
    return {event_id: (fingerprint, state) for event_id, fingerprint, state in rows}


def spent_event_keys(session: Session, keys: Sequence[str], *, now: datetime) -> set[str]:
    """The event keys among ``keys`` whose notifications retention purged, still within the horizon."""
    if not keys:
        return set()
    return set(session.scalars(select(SpentEvent.event_key)
                               .where(SpentEvent.event_key.in_(list(keys)), SpentEvent.spent_until > now)))


def load_payload(session: Session, notification_id: int) -> dict[str, Any] | None:
    payload = session.get(Payload, notification_id)
    return None if payload is None else payload.body


def drop_payload(session: Session, notification_id: int) -> None:
    """No further send can happen: forget the content and the contact details."""
    session.execute(delete(PAYLOADS).where(PAYLOADS.c.notification_id == notification_id))


_OF_NOTIFICATION: Any = bindparam("notification_id")
_DROP_PAYLOAD_OF_CURRENT = delete(PAYLOADS).where(
    PAYLOADS.c.notification_id == _OF_NOTIFICATION,
    exists().where(NOTIFICATIONS.c.id == _OF_NOTIFICATION, NOTIFICATIONS.c.current_attempt == bindparam("attempt_number")))


def drop_payloads_of_current(session: Session, attempts: Sequence[tuple[int, int]]) -> None:
    """:func:`drop_payload` for each (notification ID, attempt number) whose attempt is the
    notification's current one: a statement built once, no read first, sent as one executemany
    (one pipeline in psycopg, not a round trip each)."""
    if attempts:
        session.execute(_DROP_PAYLOAD_OF_CURRENT, [{"notification_id": notification_id, "attempt_number": number}
                                                   for notification_id, number in attempts])


@dataclass(frozen=True)
class NotificationFilter:
    """Which notifications an operator's list shows (every field optional: None matches all)."""

    state: str | None = None
    route: str | None = None
    workspace: str | None = None
    error_kind: str | None = None
    since: datetime | None = None  # created at or after
    before_id: int | None = None  # the page after the one whose last row this was (a cursor)


def recent_notifications(session: Session, *, filters: NotificationFilter = NotificationFilter(),
                         limit: int = 50) -> list[Notification]:
    """Notifications matching ``filters``, newest first, at most ``limit``."""
    query = select(Notification).order_by(Notification.id.desc()).limit(limit)
    for column, value in ((Notification.state, filters.state), (Notification.route, filters.route),
                          (Notification.workspace, filters.workspace), (Notification.error_kind, filters.error_kind)):
        if value is not None:
            query = query.where(column == value)
    if filters.since is not None:
        query = query.where(Notification.created_at >= filters.since)
    if filters.before_id is not None:
        query = query.where(Notification.id < filters.before_id)
    return list(session.scalars(query))


# --- attempts -------------------------------------------------------------------------------


def attempts_of(session: Session, notification_id: int) -> list[Attempt]:
    return list(
        session.scalars(select(Attempt).where(Attempt.notification_id == notification_id).order_by(Attempt.number))
    )


def load_for_send(session: Session, notification_id: int) -> Row[Any] | None:
    """The notification's routing columns and its payload, in one round trip."""
    return session.execute(LOAD_FOR_SEND, {"notification_id": notification_id}).one_or_none()


def trace_parent_of(session: Session, notification_id: int) -> str | None:
    """The notification's stored trace context (dispatcher.tracing); None without one."""
    return session.scalar(select(Notification.trace_parent).where(Notification.id == notification_id))


def message_adopted_elsewhere(session: Session, workspace: str, message_id: int) -> bool:
    return session.scalar(select(func.count()).select_from(Attempt).where(
        Attempt.workspace == workspace, Attempt.message_id == message_id)) != 0


# --- the reuse caches -----------------------------------------------------------------------


def known_contact_id(session: Session, *, account: Account, key: str) -> int | None:
    return session.scalar(
        select(KnownContact.contact_id).where(of_account(KnownContact, account), KnownContact.identity_key == key)
    )


def remember_contact(session: Session, *, account: Account, keys: Iterable[str], contact_id: int) -> None:
    for key in keys:
        _insert_ignoring_conflict(
            session, KnownContact, {**account.columns, "identity_key": key, "contact_id": contact_id,
                                    "created_at": utcnow()}
        )


SOURCE_ID_USED = "-"  # what is left of a source_id once its conversation exists


def known_source_id(session: Session, *, account: Account, contact_id: int, inbox_id: int) -> str | None:
    """The pair's stored source_id; None when none is stored, or only the mark of a used one."""
    stored = session.scalar(
        select(ContactInbox.source_id).where(
            _same_pair(ContactInbox, account=account, contact_id=contact_id, inbox_id=inbox_id)
        )
    )
    return None if stored == SOURCE_ID_USED else stored


@built_once
def _REMEMBER_SOURCE_ID(dialect: str) -> Any:  # noqa: N802 (a statement, named as the constant it is)
    table = table_of(ContactInbox)
    statement = dialect_insert(dialect)(table).values(
        {column: bindparam(column) for column in ("instance", "account_id", "contact_id", "inbox_id", "source_id")})
    return statement.on_conflict_do_update(
        index_elements=[table.c.instance, table.c.account_id, table.c.contact_id, table.c.inbox_id],
        set_={"source_id": statement.excluded.source_id},
        where=table.c.source_id == SOURCE_ID_USED,
    )


def remember_source_id(session: Session, *, account: Account, contact_id: int, inbox_id: int, source_id: str) -> str:
    """Store the first source_id seen for the pair (or replace the mark of a used one) and return the
    stored one (maybe a racer's)."""
    session.execute(_REMEMBER_SOURCE_ID(session), {**account.columns, "contact_id": contact_id, "inbox_id": inbox_id,
                                                   "source_id": source_id})
    stored = known_source_id(session, account=account, contact_id=contact_id, inbox_id=inbox_id)
    assert stored is not None
    return stored


def forget_contact(session: Session, *, account: Account, keys: Sequence[str]) -> None:
    """The workspace no longer has the contact (or its conversation): forget every cached id of it,
    so the next run looks it up, and makes what is missing, again."""
    contact_ids = list(session.scalars(select(KnownContact.contact_id).where(
        of_account(KnownContact, account), KnownContact.identity_key.in_(list(keys)))))
    session.execute(delete(KnownContact).where(of_account(KnownContact, account),
                                               KnownContact.identity_key.in_(list(keys))))
    if contact_ids:
        for model in (KnownContact, ContactInbox, ConversationLink):
            session.execute(delete(model).where(of_account(model, account), model.contact_id.in_(contact_ids)))


def conversation_link(session: Session, *, account: Account, contact_id: int, inbox_id: int) -> ConversationLink | None:
    return session.scalars(
        select(ConversationLink)
        .where(_same_pair(ConversationLink, account=account, contact_id=contact_id, inbox_id=inbox_id))
        .execution_options(populate_existing=True)
    ).one_or_none()


def _same_pair(model: Any, *, account: Account, contact_id: int, inbox_id: int) -> Any:
    return of_account(model, account) & (model.contact_id == contact_id) & (model.inbox_id == inbox_id)


def claim_conversation(
    session: Session, *, account: Account, contact_id: int, inbox_id: int, now: datetime, until: datetime
) -> float:
    """Claim the right to create the pair's conversation: 0.0 when claimed, else the seconds left
    on another holder's claim (wait that long; a holder that died leaves a claim that expires)."""
    pair = {"contact_id": contact_id, "inbox_id": inbox_id}
    _insert_ignoring_conflict(session, ConversationLink, {**account.columns, **pair, "conversation_id": None,
                                                          "claimed_until": None})
    result = session.execute(
        update(ConversationLink)
        .where(
            _same_pair(ConversationLink, account=account, **pair),
            ConversationLink.conversation_id.is_(None),
            or_(ConversationLink.claimed_until.is_(None), ConversationLink.claimed_until < now),
        )
        .values(claimed_until=until)
    )
    if result.rowcount == 1:  # type: ignore[attr-defined]
        return 0.0
    link = conversation_link(session, account=account, **pair)
    if link is None or link.claimed_until is None:
        return 0.5  # it was linked meanwhile: the next try reads it
    return max((link.claimed_until - now).total_seconds(), 0.5)


def link_conversation(session: Session, *, account: Account, contact_id: int, inbox_id: int, conversation_id: int) -> None:
    """Remember the pair's conversation, and forget its source_id: on SMS and platform inboxes it
    is the phone number (or an e-mail address), and nothing needs it once the conversation exists
    (a conversation the workspace loses is resolved again from a fresh listContactableInboxes)."""
    pair = {"contact_id": contact_id, "inbox_id": inbox_id}
    session.execute(
        update(ConversationLink).where(_same_pair(ConversationLink, account=account, **pair))
        .values(conversation_id=conversation_id, claimed_until=None)
    )
    session.execute(update(ContactInbox).where(_same_pair(ContactInbox, account=account, **pair)).values(source_id=SOURCE_ID_USED))


def release_conversation_claim(session: Session, *, account: Account, contact_id: int, inbox_id: int) -> None:
    """Give the claim back at once after a failed create, so the next try need not wait it out."""
    pair = {"contact_id": contact_id, "inbox_id": inbox_id}
    session.execute(
        update(ConversationLink)
        .where(_same_pair(ConversationLink, account=account, **pair), ConversationLink.conversation_id.is_(None))
        .values(claimed_until=None)
    )


def _same_pair_as_contact(model: Any) -> Any:
    return ((model.instance == KnownContact.instance) & (model.account_id == KnownContact.account_id)
            & (model.contact_id == KnownContact.contact_id) & (model.inbox_id == bindparam("inbox_id")))


# Built once (the warm path runs it for every send): the keys are one expanding parameter.
_CACHED_TARGET = (
    select(KnownContact.identity_key, KnownContact.contact_id, ContactInbox.source_id, ConversationLink.conversation_id,
           ServiceWindow.last_incoming_at)
    .select_from(KnownContact)
    .outerjoin(ContactInbox, _same_pair_as_contact(ContactInbox))
    .outerjoin(ConversationLink, _same_pair_as_contact(ConversationLink))
    .outerjoin(ServiceWindow, _same_pair_as_contact(ServiceWindow))
    .where(KnownContact.instance == bindparam("instance"), KnownContact.account_id == bindparam("account_id"),
           KnownContact.identity_key.in_(bindparam("keys", expanding=True)))
)


PAYLOAD_CONTACT_KEYS = "contact_keys"  # the payload's keyed hashes of its contact, identifier first (written at intake)


@dataclass(frozen=True)
class CachedTarget:
    """What the store knows of a contact for an inbox (see :func:`cached_target`)."""

    contact_id: int | None
    source_id: str | None
    conversation_id: int | None
    last_incoming_at: datetime | None


NO_TARGET = CachedTarget(None, None, None, None)


def cached_target_of_payload(body: Any, inbox_id: Any, *, instance: Any, account_id: Any) -> Any:
    """:func:`cached_target` as a LATERAL subquery of PostgreSQL, for a statement that reads the
    payload anyway (the send's load): the keys are the payload's own (``body``, a JSON column
    expression), ``inbox_id`` an expression of the route's inbox (NULL: none known, so no target).
    Columns ``contact_id``, ``source_id``, ``conversation_id``, ``last_incoming_at``; no row when no
    key is known (identifier before phone, as the keys stand in the payload)."""
    key = func.json_array_elements_text(body[PAYLOAD_CONTACT_KEYS]).table_valued(
        "value", with_ordinality="position").render_derived(name="contact_key")
    known, links, conversations, windows = (table_of(model).alias(f"target_{name}") for model, name in (
        (KnownContact, "contact"), (ContactInbox, "source"), (ConversationLink, "conversation"),
        (ServiceWindow, "window")))

    def same_pair(table: Any) -> Any:
        return ((table.c.instance == known.c.instance) & (table.c.account_id == known.c.account_id)
                & (table.c.contact_id == known.c.contact_id) & (table.c.inbox_id == inbox_id))

    return (
        select(known.c.contact_id, links.c.source_id, conversations.c.conversation_id, windows.c.last_incoming_at)
        .select_from(key.join(known, known.c.identity_key == key.c.value)
                     .outerjoin(links, same_pair(links)).outerjoin(conversations, same_pair(conversations))
                     .outerjoin(windows, same_pair(windows)))
        .where(known.c.instance == instance, known.c.account_id == account_id)
        .order_by(key.c.position)
        .limit(1)
        .lateral("cached_target")
    )


def cached_target(session: Session, *, account: Account, keys: Sequence[str], inbox_id: int) -> CachedTarget:
    """What the store already knows for a contact and inbox, in one round trip: contact_id,
    source_id, conversation display ID, and the time of the contact's last incoming message
    through the inbox (whether its service window is open is the channel policy's to say)."""
    if not keys:
        return NO_TARGET
    rows = session.execute(_CACHED_TARGET, {"instance": account.instance, "account_id": account.id, "inbox_id": inbox_id,
                                            "keys": list(keys)}).all()
    if not rows:
        return NO_TARGET
    row = min(rows, key=lambda found: list(keys).index(found.identity_key))  # identifier before phone
    return CachedTarget(row.contact_id, row.source_id, row.conversation_id, row.last_incoming_at)


def last_incoming_at(session: Session, *, account: Account, contact_id: int, inbox_id: int) -> datetime | None:
    """When the contact last wrote to us through the inbox (None: never, or not since it was recorded)."""
    return session.scalar(
        select(ServiceWindow.last_incoming_at).where(
            _same_pair(ServiceWindow, account=account, contact_id=contact_id, inbox_id=inbox_id)
        )
    )


def attempt_numbered(session: Session, notification_id: int, number: int) -> Attempt | None:
    """The notification's attempt of that number, if its row was made."""
    return session.execute(
        select(Attempt).where(Attempt.notification_id == notification_id, Attempt.number == number)
    ).scalar_one_or_none()


def workspace_of_row(session: Session, table: str, row_id: int) -> str | None:
    """The workspace of a notification (``table`` "notifications") or a webhook delivery
    ("webhook_deliveries") by its row ID; None when there is no such row."""
    if table == "notifications":
        found = session.scalar(select(Notification.workspace).where(Notification.id == row_id))
    elif table == "webhook_deliveries":
        found = session.scalar(select(WebhookDelivery.workspace).where(WebhookDelivery.id == row_id))
    else:
        raise ValueError("table: neither notifications nor webhook_deliveries")
    return str(found) if found is not None else None


def first_attempt_pair(session: Session, event_id: str) -> tuple[int, int] | None:
    """The contact and inbox the first attempt of the event's notification went to (None: not yet
    resolved, or no such event)."""
    row = session.execute(
        select(Attempt.contact_id, Attempt.inbox_id).join(Notification, Attempt.notification_id == Notification.id)
        .where(Notification.event_id == event_id, Attempt.number == 1)
    ).one_or_none()
    if row is None or row.contact_id is None or row.inbox_id is None:
        return None
    return row.contact_id, row.inbox_id


# --- delivery tracking ----------------------------------------------------------------------


def attempt_by_message(session: Session, workspace: str, message_id: int) -> Attempt | None:
    """The attempt of ``workspace`` that sent this message (message IDs are one instance's: another
    workspace's message may bear the same). The consumer's locked read is :func:`attempts_for_outcomes`."""
    query = (select(Attempt).where(Attempt.workspace == workspace, Attempt.message_id == message_id)
             .execution_options(populate_existing=True))
    return session.scalars(query).one_or_none()


@dataclass(frozen=True)
class OutcomeAttempt:
    """What applying an outcome reads of the attempt that sent the message."""

    id: int
    notification_id: int
    number: int
    state: str
    purpose: str
    accepted_at: datetime | None
    channel: str  # what the read-back plan asks: does this channel ever report read?
    route: str  # the delivery latency's label (metrics.DELIVERY_LATENCY)


# By message ID: a consumer locks the attempts of a group's messages in the same order as every
# other (PostgreSQL locks the rows as the sorted rows come out), so two never wait on each other.
_ATTEMPTS_OF_MESSAGES = select(
    ATTEMPTS.c.message_id, ATTEMPTS.c.id, ATTEMPTS.c.notification_id, ATTEMPTS.c.number, ATTEMPTS.c.state,
    ATTEMPTS.c.purpose, ATTEMPTS.c.accepted_at, ATTEMPTS.c.channel, ATTEMPTS.c.route,
).where(ATTEMPTS.c.workspace == bindparam("workspace"),
        ATTEMPTS.c.message_id.in_(bindparam("message_ids", expanding=True))).order_by(ATTEMPTS.c.message_id)
_ATTEMPTS_OF_MESSAGES_LOCKED = _ATTEMPTS_OF_MESSAGES.with_for_update()


def attempts_for_outcomes(session: Session, workspace: str, message_ids: Sequence[int]) -> dict[int, OutcomeAttempt]:
    """The attempts that sent these messages, for the outcome consumer, by message ID: those that
    are ``workspace``'s, the columns it reads, in one statement built once, with no ORM object to
    load; locked for the transaction on PostgreSQL, in message order, so concurrent consumers of
    the same messages take turns and never deadlock."""
    if not message_ids:
        return {}
    locked = session.get_bind().dialect.name == "postgresql"
    rows = session.execute(_ATTEMPTS_OF_MESSAGES_LOCKED if locked else _ATTEMPTS_OF_MESSAGES,
                           {"workspace": workspace, "message_ids": sorted(set(message_ids))})
    return {row[0]: OutcomeAttempt(*row[1:]) for row in rows}


APPLIED_STATUSES_AT_ONCE = 32  # rows of one INSERT: a group larger than this takes more than one


@functools.cache
def _record_applied_statuses_statement(rows: int) -> Any:
    """The INSERT of ``rows`` applied statuses, built once per row count (at most
    :data:`APPLIED_STATUSES_AT_ONCE` of them). SQLAlchemy 2.0 caches no dialect's INSERT ... ON
    CONFLICT: built as Core, it is compiled anew on every call, once per group. The same text suits
    SQLite and PostgreSQL; RETURNING, not the row count: psycopg 3 reports -1 for an INSERT ... ON
    CONFLICT DO NOTHING, and it names which rows were new."""
    values = ", ".join(f"(:workspace, :message_{row}, :status_{row}, :applied_at)" for row in range(rows))
    return text(
        f"INSERT INTO {table_of(AppliedStatus).name} (workspace, message_id, status, applied_at)"
        f" VALUES {values} ON CONFLICT DO NOTHING RETURNING message_id, status"
    ).bindparams(bindparam("applied_at", type_=table_of(AppliedStatus).c.applied_at.type))


def record_applied_status(session: Session, workspace: str, message_id: int, status: str) -> bool:
    """Note that (workspace, message, status) is being applied; False when it was already."""
    return (message_id, status) in record_applied_statuses(session, workspace, [(message_id, status)])


def record_applied_statuses(session: Session, workspace: str,
                            statuses: Sequence[tuple[int, str]]) -> set[tuple[int, str]]:
    """:func:`record_applied_status` for several (message, status) pairs, in one statement (per
    :data:`APPLIED_STATUSES_AT_ONCE`): the pairs that were not applied before. A pair given twice
    is new at most once."""
    pairs = list(dict.fromkeys(statuses))
    new: set[tuple[int, str]] = set()
    applied_at = utcnow()
    for start in range(0, len(pairs), APPLIED_STATUSES_AT_ONCE):
        chunk = pairs[start:start + APPLIED_STATUSES_AT_ONCE]
        params: dict[str, Any] = {"workspace": workspace, "applied_at": applied_at}
        for row, (message_id, status) in enumerate(chunk):
            params[f"message_{row}"], params[f"status_{row}"] = message_id, status
        new.update((row.message_id, row.status)
                   for row in session.execute(_record_applied_statuses_statement(len(chunk)), params))
    return new


def lock_attempts_and_record_statuses(session: Session, workspace: str, message_ids: Sequence[int],
                                      statuses: Sequence[tuple[int, str]]) -> tuple[dict[int, OutcomeAttempt],
                                                                                  set[tuple[int, str]]]:
    """What a group of outcomes reads first: :func:`attempts_for_outcomes` (locked, in message
    order), and :func:`record_applied_statuses` of the (message, status) pairs whose message is
    one of those attempts'. One statement on PostgreSQL (the lock as a CTE, the insert as another
    that takes only the locked messages' pairs): a lone delivery's task makes one round trip fewer.
    SQLite runs the two."""
    if not message_ids or session.get_bind().dialect.name != "postgresql":
        read = attempts_for_outcomes(session, workspace, message_ids)
        return read, record_applied_statuses(session, workspace, [pair for pair in statuses if pair[0] in read])
    pairs = list(dict.fromkeys(statuses))
    rows = session.execute(_LOCK_AND_RECORD, {
        "workspace": workspace, "message_ids": sorted(set(message_ids)), "applied_at": utcnow(),
        "status_messages": [message_id for message_id, _ in pairs], "statuses": [status for _, status in pairs]})
    attempts: dict[int, OutcomeAttempt] = {}
    new: set[tuple[int, str]] = set()
    for row in rows:
        attempts[row.message_id] = OutcomeAttempt(row.id, row.notification_id, row.number, row.state, row.purpose,
                                                  row.accepted_at, row.channel, row.route)
        new.update((row.message_id, status) for status in row.new_statuses)
    return attempts, new


_LOCK_AND_RECORD = text(
    "WITH locked AS ("
    " SELECT message_id, id, notification_id, number, state, purpose, accepted_at, channel, route"
    f" FROM {ATTEMPTS.name} WHERE workspace = :workspace AND message_id = ANY(:message_ids)"
    " ORDER BY message_id FOR UPDATE),"
    " recorded AS ("
    f" INSERT INTO {table_of(AppliedStatus).name} (workspace, message_id, status, applied_at)"
    " SELECT DISTINCT CAST(:workspace AS VARCHAR), pair.message_id, pair.status, :applied_at"
    " FROM unnest(CAST(:status_messages AS BIGINT[]), CAST(:statuses AS VARCHAR[])) AS pair(message_id, status)"
    " WHERE pair.message_id IN (SELECT message_id FROM locked)"
    " ON CONFLICT DO NOTHING RETURNING message_id, status)"
    " SELECT locked.*, ARRAY(SELECT recorded.status FROM recorded WHERE recorded.message_id = locked.message_id)"
    " AS new_statuses FROM locked ORDER BY locked.message_id"
).bindparams(bindparam("applied_at", type_=table_of(AppliedStatus).c.applied_at.type)).columns(
    *(ATTEMPTS.c[name] for name in ("message_id", "id", "notification_id", "number", "state", "purpose", "accepted_at",
                                    "channel", "route")))


def open_service_window(session: Session, *, account: Account, contact_id: int, inbox_id: int, at: datetime) -> None:
    """Record an incoming message's time for the pair; an older report never moves it back."""
    session.execute(_OPEN_SERVICE_WINDOW(session), {**account.columns, "contact_id": contact_id, "inbox_id": inbox_id,
                                                    "last_incoming_at": at})


@built_once
def _OPEN_SERVICE_WINDOW(dialect: str) -> Any:  # noqa: N802 (a statement, named as the constant it is)
    table = table_of(ServiceWindow)
    statement = dialect_insert(dialect)(table).values(
        {column: bindparam(column) for column in ("instance", "account_id", "contact_id", "inbox_id", "last_incoming_at")})
    later = func.max if dialect == "sqlite" else func.greatest  # SQLite's two-argument max is PostgreSQL's greatest
    return statement.on_conflict_do_update(
        index_elements=[table.c.instance, table.c.account_id, table.c.contact_id, table.c.inbox_id],
        set_={"last_incoming_at": later(table.c.last_incoming_at, statement.excluded.last_incoming_at)},
    )


def note_read(session: Session, workspace: str, message_ids: Sequence[int], *, at: datetime) -> dict[int, tuple[int, str]]:
    """The message list was read at ``at`` (the moment the call began) through ``workspace``: note
    it on that workspace's attempts among ``message_ids``; their attempt ID and state, by message ID."""
    if not message_ids:
        return {}
    rows = session.execute(
        update(ATTEMPTS).where(ATTEMPTS.c.workspace == workspace, ATTEMPTS.c.message_id.in_(list(message_ids)))
        .values(last_read_at=at)
        .returning(ATTEMPTS.c.message_id, ATTEMPTS.c.id, ATTEMPTS.c.state)
    ).all()
    return {row.message_id: (row.id, row.state) for row in rows}


# The first clean update's digest is kept; the statement answers the digest kept, this one or an
# earlier: one round trip, and two consumers of one message cannot both take theirs for the first.
_NOTE_UPDATE = (update(ATTEMPTS).where(ATTEMPTS.c.id == bindparam("attempt_id"))
                .values(first_update_digest=func.coalesce(ATTEMPTS.c.first_update_digest, bindparam("digest")))
                .returning(ATTEMPTS.c.first_update_digest))


def note_update(session: Session, attempt_id: int, digest: str) -> bool:
    """An update of the attempt's message, without a failure, was reported with ``digest``: keep it
    if it is the first. True when an earlier, different one was kept: two distinct updates."""
    kept = session.execute(_NOTE_UPDATE, {"attempt_id": attempt_id, "digest": digest}).scalar_one_or_none()
    return kept is not None and kept != digest


@dataclass(frozen=True)
class ReceivedEvidence:
    """What every delivery received about one message says, applied or not (a busy consumer's, or
    one that came before its send was recorded and was taken for another's message)."""

    distinct_updates: int  # updates without a failure, copies counted once (their bodies are the same)
    furthest_status: str | None  # the furthest delivery status an event carried: delivered or read


_FURTHER = ("delivered", "read")


def received_evidence(session: Session, workspace: str, message_id: int) -> ReceivedEvidence:
    """:class:`ReceivedEvidence` of the message, from ``webhook_deliveries`` (by its message index).
    A delivery stored without a digest counts as an update of its own."""
    rows = session.execute(select(WebhookDelivery.id, WebhookDelivery.summary).where(
        WebhookDelivery.workspace == workspace, WebhookDelivery.message_id == message_id,
        WebhookDelivery.event.in_(("message_created", "message_updated"))))
    seen: set[str] = set()
    furthest: str | None = None
    for row_id, summary in rows:
        status = summary.get("status") if isinstance(summary, dict) else None
        if status in _FURTHER and (furthest is None or _FURTHER.index(status) > _FURTHER.index(furthest)):
            furthest = status
        if summary.get("event") == "message_updated" and _clean_update(summary):
            seen.add(summary.get("body_digest") or f"row {row_id}")
    return ReceivedEvidence(len(seen), furthest)


def _clean_update(summary: Any) -> bool:
    """The stored summary (dispatcher.tracking.webhooks.events.EventSummary, as JSON) of an update
    that reports no failure, of a message not incoming."""
    return (isinstance(summary, dict) and not summary.get("external_error") and summary.get("status") != "failed"
            and summary.get("private") is not True and summary.get("message_type") != "incoming")


def schedule_read(session: Session, attempt_id: int, *, at: datetime | None) -> None:
    """When reconciliation reads the attempt back next (None: never again)."""
    session.execute(update(ATTEMPTS).where(ATTEMPTS.c.id == attempt_id).values(next_read_at=at))


def take_lost_deliveries(session: Session, *, quiet_since: datetime, now: datetime, limit: int,
                         workspace: str = "default", queue_holds_tasks: bool = False) -> list[int]:
    """Recorded webhook deliveries whose outcome task never finished (lost with a consumer), with no
    news since ``quiet_since``: neither received nor published again after it. They are marked as
    published again now, so each one goes to the queue at most once per grace period, however
    often the sweep runs while the consumers are down.

    ``queue_holds_tasks``: the outcomes queue held tasks as the sweep began, so a delivery no
    consumer has started is taken to have its task there still (consumers stopped or behind): only
    one whose task started and never finished (its consumer died) is published again, and only
    once while the queue is not empty. One queued task per delivery, however long they are stopped."""
    lost = _LOST_STARTED_DELIVERIES if queue_holds_tasks else _LOST_DELIVERIES
    ids = list(session.scalars(lost, {"workspace": workspace, "quiet_since": quiet_since, "limit": limit}))
    if ids:
        session.execute(_REPUBLISHED, {"ids": ids, "now": now})
    return ids


_DELIVERIES = table_of(WebhookDelivery)
_QUIET_SINCE = bindparam("quiet_since", type_=_DELIVERIES.c.received_at.type)


def _lost_deliveries(*which: Any) -> Any:
    """Unprocessed deliveries of a workspace received before ``quiet_since`` that also meet ``which``."""
    return (select(_DELIVERIES.c.id)
            .where(_DELIVERIES.c.workspace == bindparam("workspace"), _DELIVERIES.c.processed_at.is_(None),
                   _DELIVERIES.c.received_at < _QUIET_SINCE, *which)
            .order_by(_DELIVERIES.c.id)
            .limit(bindparam("limit")))


# Built once: every tracking sweep runs them.
_LOST_DELIVERIES = _lost_deliveries(or_(_DELIVERIES.c.republished_at.is_(None),
                                        _DELIVERIES.c.republished_at < _QUIET_SINCE))
_LOST_STARTED_DELIVERIES = _lost_deliveries(_DELIVERIES.c.tries > 0, _DELIVERIES.c.republished_at.is_(None))
_REPUBLISHED = (update(_DELIVERIES).where(_DELIVERIES.c.id.in_(bindparam("ids", expanding=True)))
                .values(republished_at=bindparam("now", type_=_DELIVERIES.c.republished_at.type)))


def load_delivery(session: Session, delivery_row_id: int) -> WebhookDelivery | None:
    return session.get(WebhookDelivery, delivery_row_id)


@dataclass(frozen=True)
class DeliveryRun:
    """One consumer run of a delivery: its try number and what the receiver stored."""

    tries: int
    summary: dict[str, Any]
    received_at: datetime
    last_error: str | None


_DELIVERIES = table_of(WebhookDelivery)
# Parameters not named like a column: an UPDATE takes one that is as one more value to set.
_MARK_DELIVERY_PROCESSED = (
    update(_DELIVERIES)
    .where(_DELIVERIES.c.id == bindparam("row_id"), _DELIVERIES.c.processed_at.is_(None))
    .values(processed_at=bindparam("processed"), outcome=bindparam("word"))
)


_START_DELIVERY_RUNS = (
    update(_DELIVERIES)
    .where(_DELIVERIES.c.id.in_(bindparam("row_ids", expanding=True)), _DELIVERIES.c.processed_at.is_(None))
    .values(tries=_DELIVERIES.c.tries + 1)
    .returning(_DELIVERIES.c.id, _DELIVERIES.c.tries, _DELIVERIES.c.summary, _DELIVERIES.c.received_at,
               _DELIVERIES.c.last_error)
)


def start_delivery_runs(session: Session, delivery_row_ids: list[int]) -> dict[int, DeliveryRun]:
    """:func:`start_delivery_run` for several deliveries, in one statement: the unprocessed ones'
    runs, by row ID, in the order given."""
    if not delivery_row_ids:
        return {}
    rows = {row.id: DeliveryRun(row.tries, dict(row.summary), row.received_at, row.last_error)
            for row in session.execute(_START_DELIVERY_RUNS, {"row_ids": delivery_row_ids})}
    return {row_id: rows[row_id] for row_id in dict.fromkeys(delivery_row_ids) if row_id in rows}


def start_delivery_run(session: Session, delivery_row_id: int) -> DeliveryRun | None:
    """Count one more run of an unprocessed delivery and read it, in one statement; None when it
    is processed already (or gone)."""
    return start_delivery_runs(session, [delivery_row_id]).get(delivery_row_id)


def note_delivery_error(session: Session, delivery_row_id: int, *, error: str, spent_try: bool = True) -> None:
    """Keep a failed run's error kind on the row; ``spent_try=False`` gives the run's try back
    (the workspace was away: the delivery waits for it instead of running out of tries)."""
    values: dict[str, object] = {"last_error": error[:80]}
    if not spent_try:
        values["tries"] = _DELIVERIES.c.tries - 1
    session.execute(update(_DELIVERIES).where(_DELIVERIES.c.id == delivery_row_id).values(**values))


def mark_delivery_processed(session: Session, delivery_row_id: int, *, outcome: str, now: datetime) -> bool:
    result = session.execute(_MARK_DELIVERY_PROCESSED, {"row_id": delivery_row_id, "processed": now, "word": outcome[:40]})
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def mark_deliveries_processed(session: Session, outcomes: dict[int, str], *, now: datetime) -> None:
    """:func:`mark_delivery_processed` for several deliveries (each with its word): one executemany,
    which psycopg sends as one pipeline, not a round trip each."""
    if outcomes:
        session.execute(_MARK_DELIVERY_PROCESSED, [{"row_id": row_id, "processed": now, "word": word[:40]}
                                                   for row_id, word in outcomes.items()])


# --- deliveries set aside, for operators ----------------------------------------------------

SET_ASIDE = "set_aside"
DROPPED = "dropped_by_operator"


@dataclass(frozen=True)
class SetAsideDelivery:
    """A webhook delivery the consumer could not apply within its tries: IDs and why, no content."""

    row_id: int
    delivery_id: str
    event: str
    received_at: datetime
    tries: int
    last_error: str | None


def set_aside_deliveries(session: Session, *, limit: int) -> list[SetAsideDelivery]:
    rows = session.execute(
        select(WebhookDelivery.id, WebhookDelivery.delivery_id, WebhookDelivery.event, WebhookDelivery.received_at,
               WebhookDelivery.tries, WebhookDelivery.last_error)
        .where(WebhookDelivery.outcome == SET_ASIDE)
        .order_by(WebhookDelivery.id)
        .limit(limit)
    )
    return [SetAsideDelivery(*row) for row in rows]


def retry_set_aside(session: Session, row_ids: Sequence[int]) -> list[int]:
    """Make set-aside deliveries unprocessed again, with fresh tries: the tracking sweep publishes
    them on its next pass. Returns the rows that were set aside (others are left alone)."""
    deliveries = table_of(WebhookDelivery)
    return list(session.scalars(
        update(deliveries)
        .where(deliveries.c.id.in_(list(row_ids)), deliveries.c.outcome == SET_ASIDE)
        .values(processed_at=None, outcome=None, tries=0, republished_at=None)
        .returning(deliveries.c.id)
    ))


def drop_set_aside(session: Session, row_ids: Sequence[int]) -> list[int]:
    """Settle set-aside deliveries for good, as dropped by an operator (kept until retention)."""
    deliveries = table_of(WebhookDelivery)
    return list(session.scalars(
        update(deliveries)
        .where(deliveries.c.id.in_(list(row_ids)), deliveries.c.outcome == SET_ASIDE)
        .values(outcome=DROPPED)
        .returning(deliveries.c.id)
    ))
