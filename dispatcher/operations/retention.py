"""Retention: forget per-send records once they are older than the retention period.

Content and contact details never live that long (payloads go as soon as no send can need
them); this removes what is left: notifications with their attempts, recorded webhook
deliveries and applied statuses. Content hashes of accepted attempts are cleared at acceptance;
the task clears any left over (an attempt accepted by an older version) at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, update
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.lifecycle.states import ACCEPTED_ATTEMPT_STATES
from dispatcher.store.models import AppliedStatus, Attempt, Notification, Payload, WebhookDelivery, table_of

BATCH = 1000  # rows a statement; short transactions, so senders are never held up for long


@dataclass
class RetentionReport:
    notifications: int = 0
    deliveries: int = 0
    applied_statuses: int = 0
    content_hashes: int = 0


def purge(sessions: sessionmaker[Session], *, retention_days: float, now: datetime, max_batches: int = 100) -> RetentionReport:
    cutoff = now - timedelta(days=retention_days)
    report = RetentionReport()
    with sessions.begin() as session:
        report.content_hashes = _count(session.execute(
            update(table_of(Attempt))
            .where(table_of(Attempt).c.state.in_([state.value for state in ACCEPTED_ATTEMPT_STATES]),
                   table_of(Attempt).c.content_hash.is_not(None))
            .values(content_hash=None)
        ))
    for _ in range(max_batches):
        with sessions.begin() as session:
            ids = list(session.scalars(
                table_of(Notification).select().with_only_columns(table_of(Notification).c.id)
                .where(table_of(Notification).c.created_at < cutoff).limit(BATCH)
            ))
            if not ids:
                break
            # Attempts and payloads first: SQLite enforces the foreign keys without cascading by itself.
            session.execute(delete(table_of(Attempt)).where(table_of(Attempt).c.notification_id.in_(ids)))
            session.execute(delete(table_of(Payload)).where(table_of(Payload).c.notification_id.in_(ids)))
            report.notifications += _count(session.execute(
                delete(table_of(Notification)).where(table_of(Notification).c.id.in_(ids))
            ))
    with sessions.begin() as session:
        report.deliveries = _count(session.execute(
            delete(table_of(WebhookDelivery)).where(table_of(WebhookDelivery).c.received_at < cutoff)
        ))
        report.applied_statuses = _count(session.execute(
            delete(table_of(AppliedStatus)).where(table_of(AppliedStatus).c.applied_at < cutoff)
        ))
    return report


def _count(result: object) -> int:
    rowcount = getattr(result, "rowcount", -1)
    return max(int(rowcount), 0)
