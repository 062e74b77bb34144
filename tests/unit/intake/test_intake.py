"""Intake: validation names the field and stores nothing; one row per event ID; conflicts refused.

SQLite store, a list in place of the broker: no servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import EventConflict, InvalidEvent, UnknownNotification
from dispatcher.intake import outbox
from dispatcher.operations.sweep import sweep
from dispatcher.service import Dispatcher
from dispatcher.store import queries as store
from dispatcher.store.db import session_factory, shared_engine
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Notification, Payload
from tests.support.dispatcher_setup import example_settings, reminder

PHONE = "+15550309999"


@pytest.fixture()
def enqueuer() -> ListEnqueuer:
    return ListEnqueuer()


@pytest.fixture()
def dispatcher(tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch) -> Iterator[Dispatcher]:
    url = f"sqlite:///{tmp_path}/store.sqlite"
    upgrade_database(url)
    yield Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=url), enqueuer=enqueuer)


class DownBroker:
    """A broker that refuses every publish."""

    def enqueue_send(self, ids: Any, *, queue: str = "") -> list[int]:
        return []


@pytest.fixture()
def down(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Dispatcher:
    """A dispatcher whose broker refuses every publish."""
    url = f"sqlite:///{tmp_path}/down.sqlite"
    upgrade_database(url)
    return Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=url), enqueuer=DownBroker())


def _rows(dispatcher: Dispatcher) -> int:
    with dispatcher.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Notification)) or 0)


def _request(**changes: Any) -> dict[str, Any]:
    request = reminder("evt-1", identifier="patient-1", phone=PHONE)
    for dotted, value in changes.items():
        target = request
        *path, last = dotted.split("__")
        for part in path:
            target = target[part]
        if value is ...:
            target.pop(last, None)
        else:
            target[last] = value
    return request


def test_a_valid_request_is_stored_once_and_queued(dispatcher: Dispatcher, enqueuer: ListEnqueuer) -> None:
    record = dispatcher.notify(_request())
    assert record.event_id == "evt-1"
    assert record.state == "queued"
    assert record.route == "reminders" and record.fallback_route == "sms"
    assert len(enqueuer.sent) == 1
    assert _rows(dispatcher) == 1


@pytest.mark.parametrize("changes", [{}, {"send_at": "2030-01-01T09:00:00+00:00"}, {"send_at": "2030-01-01T09:00:00+02:00"}])
def test_the_record_of_a_new_notification_is_what_the_store_holds(dispatcher: Dispatcher, changes: dict[str, Any]) -> None:
    # notify builds it from the row it wrote instead of reading it back: the two must not differ,
    # in JSON too (a model's == compares instants, not offsets)
    record = dispatcher.notify(_request(**changes))
    assert record.model_dump_json() == dispatcher.status("evt-1").model_dump_json()


def test_the_record_after_a_refused_publish_is_what_the_store_holds(down: Dispatcher) -> None:
    record = down.notify(_request())
    assert record.model_dump_json() == down.status("evt-1").model_dump_json()


def test_the_same_event_again_returns_the_stored_notification(dispatcher: Dispatcher, enqueuer: ListEnqueuer) -> None:
    first = dispatcher.notify(_request())
    again = dispatcher.notify(_request())
    assert again == first
    assert _rows(dispatcher) == 1
    assert len(enqueuer.sent) == 1  # a repeat is not queued again


def test_the_same_event_with_another_request_is_a_conflict(dispatcher: Dispatcher) -> None:
    dispatcher.notify(_request())
    with pytest.raises(EventConflict) as caught:
        dispatcher.notify(_request(content="A different text"))
    assert caught.value.field == "event_id"
    assert "different request" in str(caught.value)
    assert _rows(dispatcher) == 1


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"route": "pigeons"}, "route"),
        ({"fallback_route": "nowhere"}, "fallback_route"),
        ({"fallback_route": "reminders"}, "fallback_route"),
        ({"template__name": "unknown_template"}, "template.name"),
        ({"template__language": "fr"}, "template.name"),
        ({"template__category": "MARKETING"}, "template.category"),
        ({"template__params": {"1": "only one"}}, "template.params"),
        ({"template__params": {"1": "a", "3": "b"}}, "template.params"),
        ({"contact__phone_number": "5550309999"}, "contact.phone_number"),
        ({"contact__phone_number": "+1 555 030"}, "contact.phone_number"),
        ({"contact__email": "not-an-address"}, "contact.email"),
        ({"contact": {"name": "Nobody"}}, "contact.identifier"),
        ({"template": ...}, "template"),  # free text on a platform route
        ({"content": ""}, "content"),
        ({"content": ...}, "content"),
        ({"event_id": ""}, "event_id"),
        ({"event_id": ...}, "event_id"),
        ({"send_at": "2020-01-01T00:00:00+00:00"}, "send_at"),
        ({"send_at": "2030-01-01T00:00:00"}, "send_at"),
        ({"metadata": {f"k{n}": n for n in range(21)}}, "metadata"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_a_bad_request_names_its_field_and_leaves_nothing_behind(
    dispatcher: Dispatcher, enqueuer: ListEnqueuer, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidEvent) as caught:
        dispatcher.notify(_request(**changes))
    assert caught.value.field == field, str(caught.value)
    assert _rows(dispatcher) == 0
    assert enqueuer.sent == []
    assert PHONE not in str(caught.value)


def test_an_sms_route_needs_a_phone_and_an_email_route_an_address(dispatcher: Dispatcher) -> None:
    with pytest.raises(InvalidEvent) as caught:
        dispatcher.notify({"event_id": "e-sms", "route": "sms", "contact": {"identifier": "p"}, "content": "x"})
    assert caught.value.field == "contact.phone_number"
    with pytest.raises(InvalidEvent) as caught:
        dispatcher.notify({"event_id": "e-mail", "route": "email", "contact": {"identifier": "p"}, "content": "x"})
    assert caught.value.field == "contact.email"


def test_a_fallback_to_a_platform_route_needs_a_template(dispatcher: Dispatcher) -> None:
    request = {"event_id": "e-fb", "route": "sms", "fallback_route": "reminders",
               "contact": {"identifier": "p", "phone_number": PHONE}, "content": "x"}
    with pytest.raises(InvalidEvent) as caught:
        dispatcher.notify(request)
    assert caught.value.field == "fallback_route"


def test_the_web_session_route_refuses_bulk_use(dispatcher: Dispatcher) -> None:
    cap = dispatcher.settings.routes["web_session"].max_per_minute
    assert cap == 10
    for n in range(cap):
        dispatcher.notify({"event_id": f"ws-{n}", "route": "web_session",
                           "contact": {"identifier": f"p{n}", "phone_number": PHONE}, "content": "Your visit is confirmed",
                           "consent_ref": f"form-{n}"})
    with pytest.raises(InvalidEvent) as caught:
        dispatcher.notify({"event_id": "ws-over", "route": "web_session",
                           "contact": {"identifier": "px", "phone_number": PHONE}, "content": "Your visit is confirmed",
                           "consent_ref": "form-x"})
    assert caught.value.field == "route"
    assert "low volume" in str(caught.value)


def test_json_text_is_accepted_and_bad_json_is_named(dispatcher: Dispatcher) -> None:
    import json

    assert dispatcher.notify(json.dumps(_request())).state == "queued"
    with pytest.raises(InvalidEvent) as caught:
        dispatcher.notify("{not json")
    assert caught.value.field == "body"


def test_status_of_an_unknown_event(dispatcher: Dispatcher) -> None:
    with pytest.raises(UnknownNotification):
        dispatcher.status("never-seen")


def test_content_is_kept_apart_and_only_until_sent(dispatcher: Dispatcher) -> None:
    dispatcher.notify(_request())
    with dispatcher.sessions() as session:
        notification = store.find_notification_by_event(session, "evt-1")
        assert notification is not None
        columns = {column: getattr(notification, column) for column in Notification.__table__.columns.keys()}
        assert not any(isinstance(value, str) and ("appointment" in value or PHONE in value) for value in columns.values())
        payload = session.get(Payload, notification.id)
        assert payload is not None and payload.body["content"].startswith("Reminder evt-1")


def test_send_at_is_kept_in_the_store_and_released_by_the_sweep(dispatcher: Dispatcher, enqueuer: ListEnqueuer) -> None:
    later = datetime.now(UTC) + timedelta(minutes=5)
    record = dispatcher.notify(_request(send_at=later.isoformat()))
    assert record.state == "scheduled"
    assert enqueuer.sent == []  # no broker countdown
    assert sweep(sessions=dispatcher.sessions, enqueuer=enqueuer, stale_after_s=300) == 0
    published = sweep(
        sessions=dispatcher.sessions, enqueuer=enqueuer, stale_after_s=300, clock=lambda: later + timedelta(seconds=1)
    )
    assert published == 1
    assert dispatcher.status("evt-1").state == "queued"


def test_the_outbox_stages_in_the_host_transaction_and_the_relay_publishes(
    dispatcher: Dispatcher, enqueuer: ListEnqueuer
) -> None:
    sessions = session_factory(shared_engine(dispatcher.settings.database_url))
    # A host transaction that rolls back leaves nothing
    with sessions() as session:
        outbox.add(session, _request(event_id="outbox-rolled-back"), settings=dispatcher.settings)
        session.rollback()
    # A committed one leaves a row that nothing has published yet
    with sessions.begin() as session:
        outbox.add(session, _request(event_id="outbox-1"), settings=dispatcher.settings)
    assert enqueuer.sent == []
    assert _rows(dispatcher) == 1
    # The relay publishes it once
    assert sweep(sessions=dispatcher.sessions, enqueuer=enqueuer, stale_after_s=300) == 1
    assert sweep(sessions=dispatcher.sessions, enqueuer=enqueuer, stale_after_s=300) == 0
    assert len(enqueuer.sent) == 1


def test_a_lost_task_is_queued_again_after_the_stale_time(dispatcher: Dispatcher, enqueuer: ListEnqueuer) -> None:
    dispatcher.notify(_request())
    assert len(enqueuer.sent) == 1
    later = datetime.now(UTC) + timedelta(seconds=301)
    assert sweep(sessions=dispatcher.sessions, enqueuer=enqueuer, stale_after_s=300, clock=lambda: later) == 1
    assert len(enqueuer.sent) == 2


def test_a_task_waiting_in_a_countdown_is_not_queued_again_before_it_is_stale(
    dispatcher: Dispatcher, enqueuer: ListEnqueuer
) -> None:
    record = dispatcher.notify(_request())
    now = datetime.now(UTC)
    with dispatcher.sessions.begin() as session:  # the task retries with a 200 s countdown
        found = store.find_notification_by_event(session, record.event_id)
        assert found is not None
        store.expect_run(session, found.id, at=now + timedelta(seconds=200))
    assert sweep(sessions=dispatcher.sessions, enqueuer=enqueuer, stale_after_s=20,
                 clock=lambda: now + timedelta(seconds=60)) == 0  # past stale_after_s, but its task is due later
    assert sweep(sessions=dispatcher.sessions, enqueuer=enqueuer, stale_after_s=20,
                 clock=lambda: now + timedelta(seconds=221)) == 1  # that task was lost


def test_an_enqueue_that_fails_is_relayed_by_the_sweep(down: Dispatcher) -> None:
    assert down.notify(_request()).state == "queued"
    relay = ListEnqueuer()
    assert sweep(sessions=down.sessions, enqueuer=relay, stale_after_s=300) == 1
