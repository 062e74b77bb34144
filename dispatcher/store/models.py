"""The dispatcher's tables (SQLAlchemy 2). Migrations live in ``dispatcher/migrations``.

What is kept follows the contract's recommended per-send values: the business-event ID, the
message ID, the conversation display ID, the sender inbox and channel, the acceptance time, the
latest delivery state, any terminal error and the single fallback decision. Message content and
contact details are held in :class:`Payload` only while a send may still need them, and the row
is deleted as soon as no further send can happen.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER keys only


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on SQLite as on PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: the dispatcher stores aware UTC times only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Notification(Base):
    """One business event, sent at most once per route: the host's view of it."""

    __tablename__ = "notifications"
    # The operators' filters and counts (the dashboard, `dispatcher list`). Not updated_at: nearly
    # every move sets it, and an index on it would make each of those writes touch every index.
    __table_args__ = (Index("ix_notifications_error_kind", "error_kind"),
                      Index("ix_notifications_route", "route", "id"))

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(200), unique=True)
    fingerprint: Mapped[str] = mapped_column(String(64))  # sha256 of the request: same event, same request?
    route: Mapped[str] = mapped_column(String(64))
    fallback_route: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(20), index=True)
    send_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    next_try_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)  # a long retry wait
    # The row's send task, as the sweep sees it: ``enqueued_at`` is when it was published (or is
    # due, for a retry's countdown) or when a run last touched the row; ``task_started`` says which
    # of the two. Published and not started, the task may still wait in the broker's queue: the
    # sweep publishes again only when that queue is empty. Started, its run holds a lease that
    # lapses ``stale_after_s`` after the last touch (dispatcher/operations/sweep.py).
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    task_started: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    # The current attempt's values, copied up so a status read is one row.
    channel: Mapped[str | None] = mapped_column(String(20))
    inbox_id: Mapped[int | None] = mapped_column(BigInteger)
    message_id: Mapped[int | None] = mapped_column(BigInteger)
    conversation_id: Mapped[int | None] = mapped_column(BigInteger)
    accepted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    delivery_state: Mapped[str | None] = mapped_column(String(20))
    error_kind: Mapped[str | None] = mapped_column(String(40))
    error_detail: Mapped[str | None] = mapped_column(String(200))
    # The single fallback decision: written once, by compare-and-set on fallback_decision IS NULL.
    fallback_decision: Mapped[str | None] = mapped_column(String(10))
    fallback_reason: Mapped[str | None] = mapped_column(String(200))
    fallback_decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The attempt the host's state follows: 1, then the template resend or the fallback, by number.
    current_attempt: Mapped[int] = mapped_column(SmallInteger, default=1, server_default="1")
    # what kind of notification it is, for opt-outs by category ("service", "marketing", ...)
    category: Mapped[str] = mapped_column(String(64), default="service", server_default="service")
    # the workspace it is sent through (docs/workspaces.md); "default": the top-level settings'
    workspace: Mapped[str] = mapped_column(String(64), default="default", server_default="default", index=True)
    # its lane, "urgent" or "normal" (docs/priorities.md): the request's, else its route's
    priority: Mapped[str] = mapped_column(String(8), default="normal", server_default="normal")
    # its trace's W3C traceparent (dispatcher.tracing), while tracing is on: random IDs, no content
    trace_parent: Mapped[str | None] = mapped_column(String(64))


class Attempt(Base):
    """One try through one route: number 1 is the first send, number 2 the single fallback."""

    __tablename__ = "attempts"
    # A message ID is one instance's: workspaces on separate instances number theirs alike.
    __table_args__ = (UniqueConstraint("notification_id", "number"),
                      UniqueConstraint("workspace", "message_id", name="uq_attempts_workspace_message"))

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    notification_id: Mapped[int] = mapped_column(ForeignKey("notifications.id", ondelete="CASCADE"), index=True)
    # its notification's workspace, written with the row (the lifecycle's moves read it there)
    workspace: Mapped[str] = mapped_column(String(64), default="default", server_default="default")
    number: Mapped[int] = mapped_column(SmallInteger)
    # "first", "template" (a resend as the approved template after 131047) or "fallback".
    purpose: Mapped[str] = mapped_column(String(12), default="first", server_default="first")
    route: Mapped[str] = mapped_column(String(64))
    channel: Mapped[str] = mapped_column(String(20))
    state: Mapped[str] = mapped_column(String(20), index=True)
    inbox_id: Mapped[int | None] = mapped_column(BigInteger)
    contact_id: Mapped[int | None] = mapped_column(BigInteger)
    conversation_id: Mapped[int | None] = mapped_column(BigInteger)
    message_id: Mapped[int | None] = mapped_column(BigInteger)
    content_hash: Mapped[str | None] = mapped_column(String(64))  # to recognise our message; cleared on acceptance
    tries: Mapped[int] = mapped_column(Integer, default=0)  # calls that reached the workspace and failed
    # Runs of the send task that started and never finished (crashes): the crash guard, apart from tries.
    runs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Claims for a createMessage call so far: a claim is a compare-and-set on the count its worker read.
    claims: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    in_flight_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    accepted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Its last state change (acceptance, a delivery status, a failure), written only with ``state``.
    # Indexed for the dashboard's trends of the last hour (docs/dashboard.md): a new attempt, and an
    # update that changes the (indexed) state, never a HOT update, write one index entry more; the
    # updates that leave the state (a try counted) stay HOT.
    status_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    next_read_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)  # reconciliation's next read; None: none
    last_read_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # its status last read from the message list
    # The keyed digest of the first update without a failure its message was reported with: a
    # second, different one means the message moved past sent (docs/tracking.md). No content.
    first_update_digest: Mapped[str | None] = mapped_column(String(32))
    error_kind: Mapped[str | None] = mapped_column(String(40))
    error_detail: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class Payload(Base):
    """What a send still needs (content, contact details, template parameters); deleted when done."""

    __tablename__ = "payloads"

    notification_id: Mapped[int] = mapped_column(
        ForeignKey("notifications.id", ondelete="CASCADE"), primary_key=True
    )
    body: Mapped[dict[str, Any]] = mapped_column(JSON)


class KnownContact(Base):
    """Contact identity (a hash of identifier or phone) to the service's contact_id."""

    __tablename__ = "known_contacts"

    # the account's instance (dispatcher.store.account): "default", the top-level api_url's
    instance: Mapped[str] = mapped_column(String(64), primary_key=True, default="default", server_default="default")
    account_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    identity_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    contact_id: Mapped[int] = mapped_column(BigInteger, index=True)  # back to the keys, for a reply's opt-out
    # when the contact was first resolved: retention forgets a contact's bindings once this is past
    # the period and no notification left in the store was sent to it
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ContactInbox(Base):
    """(contact, inbox) to source_id, stored once: API inboxes invent a new one on every read."""

    __tablename__ = "contact_inboxes"

    # the account's instance (dispatcher.store.account): "default", the top-level api_url's
    instance: Mapped[str] = mapped_column(String(64), primary_key=True, default="default", server_default="default")
    account_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    contact_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    inbox_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    source_id: Mapped[str] = mapped_column(String(255))


class ConversationLink(Base):
    """(contact, inbox) to the conversation display ID, created once and then reused.

    A row with no conversation_id is a claim: its holder is creating the conversation until
    ``claimed_until``; others wait, so racing workers never open two threads.
    """

    __tablename__ = "conversation_links"

    # the account's instance (dispatcher.store.account): "default", the top-level api_url's
    instance: Mapped[str] = mapped_column(String(64), primary_key=True, default="default", server_default="default")
    account_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    contact_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    inbox_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int | None] = mapped_column(BigInteger)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ServiceWindow(Base):
    """When the contact last wrote in through the inbox: the 24-hour customer-service window."""

    __tablename__ = "service_windows"

    # the account's instance (dispatcher.store.account): "default", the top-level api_url's
    instance: Mapped[str] = mapped_column(String(64), primary_key=True, default="default", server_default="default")
    account_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    contact_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    inbox_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    last_incoming_at: Mapped[datetime] = mapped_column(UTCDateTime)


class WebhookDelivery(Base):
    """A verified webhook delivery, recorded before anything acts on it (its ID is unique).

    ``summary`` holds only what the outcome consumer reads (IDs, status, error code, types and
    times), never the message content or the contact's details that the payload carries.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_message", "workspace", "message_id"),
                      Index("ix_webhook_deliveries_outcome", "outcome"))

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(String(200), unique=True)
    event: Mapped[str] = mapped_column(String(40))
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    processed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    # when the tracking sweep last published it again (its task was lost): at most once per grace period
    republished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    outcome: Mapped[str | None] = mapped_column(String(40))  # applied, ignored, stale, duplicate_status, set_aside...
    tries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # consumer runs; set aside past a bound
    last_error: Mapped[str | None] = mapped_column(String(80))  # why the last run failed: an error class, no content
    workspace: Mapped[str] = mapped_column(String(64), default="default", server_default="default")  # whose webhook
    message_id: Mapped[int | None] = mapped_column(BigInteger)  # the message it is about (the summary's), if any


class AppliedStatus(Base):
    """(message id, status) already applied: the signature does not cover the delivery ID, and
    the service sends duplicates under new IDs, so a status is applied once per message."""

    __tablename__ = "applied_statuses"

    workspace: Mapped[str] = mapped_column(String(64), primary_key=True, default="default", server_default="default")
    message_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    status: Mapped[str] = mapped_column(String(20), primary_key=True)
    applied_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class SpentEvent(Base):
    """An event ID whose notification retention purged: a keyed hash of it (no content), so the same
    event handed over again within ``event_id_spent_days`` is refused instead of sent twice."""

    __tablename__ = "spent_events"

    event_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    spent_until: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class Suppression(Base):
    """An active opt-out: this recipient gets nothing on ``channel`` in ``category`` ("*": all).

    The recipient is a keyed hash of a normalised identifier (phone, e-mail or the host's contact
    identifier), never the identifier. Kept while active, whatever retention says; lifting it
    deletes the row and leaves a :class:`SuppressionChange`."""

    __tablename__ = "suppressions"

    # the account's instance (dispatcher.store.account): "default", the top-level api_url's
    instance: Mapped[str] = mapped_column(String(64), primary_key=True, default="default", server_default="default")
    account_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    recipient_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    channel: Mapped[str] = mapped_column(String(20), primary_key=True)
    category: Mapped[str] = mapped_column(String(64), primary_key=True)
    reason: Mapped[str] = mapped_column(String(20))  # keyword, platform, host, consent_withdrawn
    since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class SuppressionChange(Base):
    """The audit trail of opt-outs, opt-ins and consent: what changed, when and why; no content."""

    __tablename__ = "suppression_changes"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    instance: Mapped[str] = mapped_column(String(64), default="default", server_default="default")
    account_id: Mapped[int] = mapped_column(BigInteger)
    recipient_key: Mapped[str] = mapped_column(String(64), index=True)
    channel: Mapped[str] = mapped_column(String(20))
    category: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(20))  # suppressed, lifted, consented, consent_withdrawn
    reason: Mapped[str] = mapped_column(String(20))
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Consent(Base):
    """A recipient's recorded consent to sends on a channel that needs it (the web-session channel);
    ``reference`` is the host's own reference to its consent record."""

    __tablename__ = "consents"

    # the account's instance (dispatcher.store.account): "default", the top-level api_url's
    instance: Mapped[str] = mapped_column(String(64), primary_key=True, default="default", server_default="default")
    account_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    recipient_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    channel: Mapped[str] = mapped_column(String(20), primary_key=True)
    reference: Mapped[str] = mapped_column(String(100))
    granted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


def table_of(model: type[Base]) -> Table:
    """A model's Core table, typed as one (the declarative stubs say FromClause)."""
    return cast(Table, model.__table__)


class Callback(Base):
    """One event told to the host's callback URL (outcome callbacks, docs/callbacks.md): written by
    the lifecycle move that changed the notification, in its transaction (an outbox), and
    delivered at least once by the callback task. Never content or contact data: IDs, state,
    channel, error kind and times only. One per notification, event type and attempt."""

    __tablename__ = "callbacks"
    __table_args__ = (UniqueConstraint("notification_id", "type", "attempt"),
                      UniqueConstraint("notification_id", "sequence", name="uq_callbacks_sequence"))

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)  # the webhook-id: msg_<id>
    notification_id: Mapped[int] = mapped_column(BigInteger, index=True)  # no key: kept past retention's purge
    event_id: Mapped[str] = mapped_column(String(200))
    route: Mapped[str] = mapped_column(String(64))  # a route may name its own callback URL
    workspace: Mapped[str] = mapped_column(String(64), default="default", server_default="default")  # and a workspace
    type: Mapped[str] = mapped_column(String(40))  # notification.accepted, .sent, ... .cancelled
    attempt: Mapped[int] = mapped_column(SmallInteger)
    state: Mapped[str] = mapped_column(String(20))
    channel: Mapped[str | None] = mapped_column(String(20))
    error_kind: Mapped[str | None] = mapped_column(String(40))
    sequence: Mapped[int] = mapped_column(Integer)  # 1, 2, ... per notification, in the order of its events
    occurred_at: Mapped[datetime] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String(12), index=True)  # pending, delivered, expired
    tries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_try_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    last_error: Mapped[str | None] = mapped_column(String(200))  # a status code or an error class, no body
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class CallbackEndpoint(Base):
    """A callback URL that keeps failing is paused here, with why, until an operator resumes it."""

    __tablename__ = "callback_endpoints"

    url_key: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the URL: it may hold a token
    failing_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    paused_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reason: Mapped[str | None] = mapped_column(String(200))
