"""Retention purges settled notifications past the period and nothing still to be sent; a purged
event ID stays spent (a keyed hash), so the same event handed over again is not sent twice."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import EventSpent
from dispatcher.lifecycle.retention import purge
from dispatcher.service import Dispatcher
from dispatcher.store.db import make_engine, session_factory
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import AppliedStatus, Attempt, Notification, Payload, SpentEvent, WebhookDelivery
from tests.support.dispatcher_setup import example_settings, reminder

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
KEY = b"retention-test-key"


@pytest.fixture()
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path}/retention.sqlite"
    upgrade_database(url)
    engine = make_engine(url)
    yield session_factory(engine)
    engine.dispose()


def _notification(session: Session, event_id: str, changed_at: datetime, state: str = "read") -> int:
    row = Notification(event_id=event_id, fingerprint="f" * 64, route="sms", state=state, created_at=changed_at,
                       updated_at=changed_at)
    session.add(row)
    session.flush()
    session.add(Attempt(notification_id=row.id, number=1, route="sms", channel="sms", state="read", tries=1,
                        content_hash="c" * 64, message_id=int(hashlib.sha256(event_id.encode()).hexdigest()[:7], 16)))
    session.add(Payload(notification_id=row.id, body={"content": "x"}))
    return row.id


def _purge(sessions: sessionmaker[Session], now: datetime = NOW) -> object:
    return purge(sessions, retention_days=30, now=now, hashing_key=KEY, spent_days=365)


def test_settled_notifications_past_the_period_go_and_everything_else_stays(sessions: sessionmaker[Session]) -> None:
    old, recent = NOW - timedelta(days=31), NOW - timedelta(days=29)
    with sessions.begin() as session:
        for state in ("read", "delivered", "failed"):
            _notification(session, f"old-{state}", old, state)
        _notification(session, "recent-read", recent)
        # still to be sent, or still waiting for its outcome: never deleted, however old
        for state in ("scheduled", "queued", "sending", "accepted", "sent", "falling_back"):
            _notification(session, f"old-{state}", old, state)
        session.add(WebhookDelivery(delivery_id="old", event="message_updated", summary={}, received_at=old))
        session.add(WebhookDelivery(delivery_id="new", event="message_updated", summary={}, received_at=recent))
        session.add(AppliedStatus(message_id=1, status="read", applied_at=old))
        session.add(AppliedStatus(message_id=2, status="read", applied_at=recent))
    report = _purge(sessions)
    with sessions() as session:
        kept = set(session.scalars(select(Notification.event_id)))
        assert kept == {"recent-read", "old-scheduled", "old-queued", "old-sending", "old-accepted", "old-sent",
                        "old-falling_back"}
        assert session.scalar(select(func.count()).select_from(Attempt)) == len(kept)
        assert session.scalar(select(func.count()).select_from(Payload)) == len(kept)
        assert list(session.scalars(select(WebhookDelivery.delivery_id))) == ["new"]
        assert list(session.scalars(select(AppliedStatus.message_id))) == [2]
        assert session.scalar(select(func.count()).select_from(SpentEvent)) == 3
        assert set(session.scalars(select(Attempt.content_hash))) == {None}  # accepted: its hash goes at once
    assert (report.notifications, report.deliveries, report.applied_statuses) == (3, 1, 1)  # type: ignore[attr-defined]


def test_a_reminder_scheduled_past_the_period_is_kept_and_purged_only_once_settled(
    sessions: sessionmaker[Session],
) -> None:
    handed_over = NOW - timedelta(days=45)  # a reminder for 45 days ahead
    with sessions.begin() as session:
        notification_id = _notification(session, "far-ahead", handed_over, "scheduled")
    _purge(sessions)
    with sessions.begin() as session:  # sent and read today: the period counts from its last change
        session.execute(update(Notification).where(Notification.id == notification_id).values(state="read", updated_at=NOW))
    _purge(sessions)
    _purge(sessions, NOW + timedelta(days=29))
    with sessions() as session:
        assert session.get(Notification, notification_id) is not None
    _purge(sessions, NOW + timedelta(days=31))
    with sessions() as session:
        assert session.get(Notification, notification_id) is None


def test_a_purged_event_stays_spent_as_a_keyed_hash_and_is_refused_when_handed_over_again(
    tmp_path: Path, clean_environment: pytest.MonkeyPatch,
) -> None:
    url = f"sqlite:///{tmp_path}/spent.sqlite"
    upgrade_database(url)
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=url)
    dispatcher = Dispatcher(settings, enqueuer=ListEnqueuer())
    request = reminder("appt-spent-1", identifier="p-spent", phone="+15550199997")
    dispatcher.notify(request)
    long_ago = datetime.now(UTC) - timedelta(days=40)
    with dispatcher.sessions.begin() as session:  # it was read 40 days ago
        session.execute(update(Notification).values(state="read", updated_at=long_ago))
    purge(dispatcher.sessions, retention_days=settings.retention_days, now=datetime.now(UTC),
          hashing_key=settings.hashing_key, spent_days=settings.event_id_spent_days)
    with dispatcher.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Notification)) == 0
        [kept] = session.scalars(select(SpentEvent.event_key))
    assert "appt-spent" not in kept and kept != hashlib.sha256(b"appt-spent-1").hexdigest()  # keyed, not enumerable
    # the same event handed over again: refused, nothing stored or queued
    with pytest.raises(EventSpent) as refused:
        dispatcher.notify(request)
    assert "not sent again" in str(refused.value)
    with dispatcher.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Notification)) == 0
    assert dispatcher.notify(reminder("appt-spent-2", identifier="p-spent", phone="+15550199997")).state == "queued"
    # past the horizon the mark goes, and the ID is free again
    purge(dispatcher.sessions, retention_days=settings.retention_days,
          now=datetime.now(UTC) + timedelta(days=settings.event_id_spent_days + 1), hashing_key=settings.hashing_key,
          spent_days=settings.event_id_spent_days)
    with dispatcher.sessions() as session:
        assert session.scalar(select(func.count()).select_from(SpentEvent)) == 0


def test_bindings_of_contacts_no_notification_left_uses_are_forgotten(sessions: sessionmaker[Session]) -> None:
    from dispatcher.store.models import ContactInbox, ConversationLink, KnownContact, ServiceWindow

    old, recent = NOW - timedelta(days=31), NOW - timedelta(days=1)
    with sessions.begin() as session:
        in_use = _notification(session, "still-waiting", old, "sent")  # its attempt went to contact 1
        session.execute(update(Attempt).where(Attempt.notification_id == in_use).values(contact_id=1))
        for contact_id, resolved_at in ((1, old), (2, old), (3, recent)):
            session.add(KnownContact(account_id=1, identity_key=f"k{contact_id}", contact_id=contact_id,
                                     created_at=resolved_at))
            session.add(ContactInbox(account_id=1, contact_id=contact_id, inbox_id=1, source_id="-"))
            session.add(ConversationLink(account_id=1, contact_id=contact_id, inbox_id=1, conversation_id=contact_id))
            session.add(ServiceWindow(account_id=1, contact_id=contact_id, inbox_id=1, last_incoming_at=resolved_at))
    report = _purge(sessions)
    with sessions() as session:
        for model in (KnownContact, ContactInbox, ConversationLink, ServiceWindow):
            assert sorted(session.scalars(select(model.contact_id))) == [1, 3], model.__name__
    assert report.contacts_forgotten == 1  # type: ignore[attr-defined]


def test_forgetting_a_contact_leaves_the_same_id_of_another_instance_alone(sessions: sessionmaker[Session]) -> None:
    from dispatcher.store.models import ContactInbox, ConversationLink, KnownContact, ServiceWindow

    old, recent = NOW - timedelta(days=31), NOW - timedelta(days=1)
    with sessions.begin() as session:  # contact 5 of the top-level instance, and another person, 5 of "south"
        for instance, resolved_at in (("default", old), ("south", recent)):
            whose = {"instance": instance, "account_id": 1, "contact_id": 5}
            session.add(KnownContact(**whose, identity_key=f"k-{instance}", created_at=resolved_at))
            session.add(ContactInbox(**whose, inbox_id=1, source_id="-"))
            session.add(ConversationLink(**whose, inbox_id=1, conversation_id=9))
            session.add(ServiceWindow(**whose, inbox_id=1, last_incoming_at=resolved_at))
    report = _purge(sessions)
    assert report.contacts_forgotten == 1  # type: ignore[attr-defined]
    with sessions() as session:
        for model in (KnownContact, ContactInbox, ConversationLink, ServiceWindow):
            assert list(session.scalars(select(model.instance))) == ["south"], model.__name__
