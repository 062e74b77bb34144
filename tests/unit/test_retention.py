"""Retention deletes what is past the period, keeps the rest, and clears leftover content hashes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select

from dispatcher.operations.retention import purge
from dispatcher.store.db import make_engine, session_factory
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import AppliedStatus, Attempt, Notification, Payload, WebhookDelivery

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _notification(session, event_id: str, created_at: datetime) -> int:  # type: ignore[no-untyped-def]
    row = Notification(event_id=event_id, fingerprint="f" * 64, route="sms", state="read", created_at=created_at,
                       updated_at=created_at)
    session.add(row)
    session.flush()
    session.add(Attempt(notification_id=row.id, number=1, route="sms", channel="sms", state="read", tries=1,
                        content_hash="c" * 64, message_id=hash(event_id) % 10_000_000))
    session.add(Payload(notification_id=row.id, body={"content": "x"}))
    return row.id


def test_purge(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/retention.sqlite"
    upgrade_database(url)
    engine = make_engine(url)
    sessions = session_factory(engine)
    old, recent = NOW - timedelta(days=31), NOW - timedelta(days=29)
    with sessions.begin() as session:
        for number in range(3):
            _notification(session, f"old-{number}", old)
        _notification(session, "recent", recent)
        session.add(WebhookDelivery(delivery_id="old", event="message_updated", summary={}, received_at=old))
        session.add(WebhookDelivery(delivery_id="new", event="message_updated", summary={}, received_at=recent))
        session.add(AppliedStatus(message_id=1, status="read", applied_at=old))
        session.add(AppliedStatus(message_id=2, status="read", applied_at=recent))
    report = purge(sessions, retention_days=30, now=NOW)
    with sessions() as session:
        assert list(session.scalars(select(Notification.event_id))) == ["recent"]
        assert session.scalar(select(func.count()).select_from(Attempt)) == 1
        assert session.scalar(select(func.count()).select_from(Payload)) == 1
        assert list(session.scalars(select(WebhookDelivery.delivery_id))) == ["new"]
        assert list(session.scalars(select(AppliedStatus.message_id))) == [2]
        assert session.scalar(select(Attempt.content_hash)) is None  # accepted: its hash goes at once
    assert (report.notifications, report.deliveries, report.applied_statuses) == (3, 1, 1)
    assert report.content_hashes == 4
    engine.dispose()
