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

from dispatcher.models import AppliedStatus, Attempt, Notification, Payload, WebhookDelivery
from dispatcher.lifecycle.states import ACCEPTED_ATTEMPT_STATES

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
            update(Attempt.__table__)
            .where(Attempt.__table__.c.state.in_([state.value for state in ACCEPTED_ATTEMPT_STATES]),
                   Attempt.__table__.c.content_hash.is_not(None))
            .values(content_hash=None)
        ))
    for _ in range(max_batches):
        with sessions.begin() as session:
            ids = list(session.scalars(
                Notification.__table__.select().with_only_columns(Notification.__table__.c.id)
                .where(Notification.__table__.c.created_at < cutoff).limit(BATCH)
            ))
            if not ids:
                break
            # Attempts and payloads first: SQLite enforces the foreign keys without cascading by itself.
            session.execute(delete(Attempt.__table__).where(Attempt.__table__.c.notification_id.in_(ids)))
            session.execute(delete(Payload.__table__).where(Payload.__table__.c.notification_id.in_(ids)))
            report.notifications += _count(session.execute(
                delete(Notification.__table__).where(Notification.__table__.c.id.in_(ids))
            ))
    with sessions.begin() as session:
        report.deliveries = _count(session.execute(
            delete(WebhookDelivery.__table__).where(WebhookDelivery.__table__.c.received_at < cutoff)
        ))
        report.applied_statuses = _count(session.execute(
            delete(AppliedStatus.__table__).where(AppliedStatus.__table__.c.applied_at < cutoff)
        ))
    return report


def _count(result: object) -> int:
    rowcount = getattr(result, "rowcount", -1)
    return max(int(rowcount), 0)
