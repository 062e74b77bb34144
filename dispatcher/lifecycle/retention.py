"""Retention: forget per-send records once they are settled and older than the retention period.

Only settled notifications (delivered, read, failed) whose last change is older than
``retention_days`` are purged, with their attempts: a reminder scheduled far ahead, or one still
waiting for its send, is never deleted. Each purged event ID leaves a keyed hash
(:class:`~dispatcher.store.models.SpentEvent`, no content) for ``event_id_spent_days``, so the
same event handed over again is refused instead of sent twice. Webhook deliveries and applied
statuses older than the period go too, and the bindings (identity hash, source_id, conversation,
service window) of contacts resolved before the period that no notification left was sent to.
Content and contact details never live that long (payloads go as soon as no send can need them);
content hashes of accepted attempts are cleared at acceptance, and the task clears any left over
(an attempt accepted by an older version).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, exists, select, tuple_, update
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.lifecycle.states import ACCEPTED_ATTEMPT_STATES, SETTLED_NOTIFICATION_STATES
from dispatcher.store.db import insert_for
from dispatcher.store.models import (
    AppliedStatus,
    Attempt,
    Callback,
    ContactInbox,
    ConversationLink,
    KnownContact,
    Notification,
    Payload,
    ServiceWindow,
    SpentEvent,
    WebhookDelivery,
    table_of,
)
from dispatcher.store.queries import event_key

BATCH = 1000  # rows a statement; short transactions, so senders are never held up for long


@dataclass
class RetentionReport:
    notifications: int = 0
    deliveries: int = 0
    applied_statuses: int = 0
    content_hashes: int = 0
    spent_events_expired: int = 0
    contacts_forgotten: int = 0
    callbacks: int = 0


def purge(sessions: sessionmaker[Session], *, retention_days: float, now: datetime, hashing_key: bytes,
          spent_days: float, max_batches: int = 100) -> RetentionReport:
    cutoff = now - timedelta(days=retention_days)
    spent_until = now + timedelta(days=spent_days)
    notifications, attempts, payloads = table_of(Notification), table_of(Attempt), table_of(Payload)
    report = RetentionReport()
    with sessions.begin() as session:
        report.content_hashes = _count(session.execute(
            update(attempts)
            .where(attempts.c.state.in_([state.value for state in ACCEPTED_ATTEMPT_STATES]),
                   attempts.c.content_hash.is_not(None))
            .values(content_hash=None)
        ))
    for _ in range(max_batches):
        with sessions.begin() as session:
            rows = session.execute(
                select(notifications.c.id, notifications.c.event_id)
                .where(notifications.c.state.in_([state.value for state in SETTLED_NOTIFICATION_STATES]),
                       notifications.c.updated_at < cutoff)
                .limit(BATCH)
            ).all()
            if not rows:
                break
            ids = [row.id for row in rows]
            _spend(session, [event_key(row.event_id, key=hashing_key) for row in rows], spent_until)
            # Attempts and payloads first: SQLite enforces the foreign keys without cascading by itself.
            session.execute(delete(attempts).where(attempts.c.notification_id.in_(ids)))
            session.execute(delete(payloads).where(payloads.c.notification_id.in_(ids)))
            report.notifications += _count(session.execute(delete(notifications).where(notifications.c.id.in_(ids))))
    with sessions.begin() as session:
        report.deliveries = _count(session.execute(
            delete(table_of(WebhookDelivery)).where(table_of(WebhookDelivery).c.received_at < cutoff)
        ))
        report.applied_statuses = _count(session.execute(
            delete(table_of(AppliedStatus)).where(table_of(AppliedStatus).c.applied_at < cutoff)
        ))
        report.spent_events_expired = _count(session.execute(
            delete(table_of(SpentEvent)).where(table_of(SpentEvent).c.spent_until <= now)
        ))
        # Told (or given up on) long ago, and their notification purged: while it exists its events
        # stay, so its next event is numbered after them.
        callbacks = table_of(Callback)
        report.callbacks = _count(session.execute(
            delete(callbacks).where(callbacks.c.status != "pending", callbacks.c.occurred_at < cutoff,
                                    ~exists().where(notifications.c.id == callbacks.c.notification_id))
        ))
    with sessions.begin() as session:
        report.contacts_forgotten = _forget_unused_contacts(session, cutoff)
    return report


def _forget_unused_contacts(session: Session, cutoff: datetime) -> int:
    """Forget the bindings of contacts first resolved before the cut-off that no notification left
    in the store was sent to: their identity hashes, source_ids, conversations and service windows.
    A later notification to one of them finds it again with one search."""
    known, attempts = table_of(KnownContact), table_of(Attempt)
    # A contact ID is one account's, of one instance: contact 5 of another instance is another
    # person. Kept while any attempt names the ID at all (keeping too much is safe).
    # NOT EXISTS, an anti-join: NOT IN (SELECT ...) was re-read once per contact once the attempts
    # outgrew PostgreSQL's work_mem, and from a million rows the statement timeout cancelled every
    # run (issue 20's 10x run), so no contact was ever forgotten.
    still_used = exists().where(attempts.c.contact_id == known.c.contact_id)
    stale = [tuple(row) for row in session.execute(
        select(known.c.instance, known.c.account_id, known.c.contact_id)
        .where(known.c.created_at < cutoff, ~still_used).distinct()
    )]
    for model in (KnownContact, ContactInbox, ConversationLink, ServiceWindow):
        table = table_of(model)
        whose = tuple_(table.c.instance, table.c.account_id, table.c.contact_id)
        for start in range(0, len(stale), BATCH):
            session.execute(delete(table).where(whose.in_(stale[start:start + BATCH])))
    return len(stale)


def _spend(session: Session, keys: list[str], spent_until: datetime) -> None:
    """Record the event IDs as spent; one already recorded keeps the later of the two horizons."""
    insert = insert_for(session)
    table = table_of(SpentEvent)
    statement = insert(table).values([{"event_key": key, "spent_until": spent_until} for key in keys])
    session.execute(statement.on_conflict_do_update(index_elements=[table.c.event_key],
                                                    set_={"spent_until": statement.excluded.spent_until}))


def _count(result: object) -> int:
    rowcount = getattr(result, "rowcount", -1)
    return max(int(rowcount), 0)
