"""Outcome callbacks: written by the moves (only when a URL takes them), signed so that the
Standard Webhooks library verifies them, delivered with backoff, paused, resumed, replayed."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select
from standardwebhooks import Webhook

from dispatcher.callbacks.deliver import DeliveryReport, deliver_due
from dispatcher.callbacks.signing import headers
from dispatcher.enqueue import ListEnqueuer
from dispatcher.lifecycle import moves
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings
from dispatcher.store import callbacks as outbox
from dispatcher.store import queries as store
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Callback
from tests.support.dispatcher_setup import example_settings, reminder

NEW_SECRET = "whsec_" + base64.b64encode(b"n" * 32).decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()
URL = "https://host.example/hooks?token=secret-in-url"
PHONE = "+15550380001"


def settings_for(url: str, **changes: object) -> Settings:
    return example_settings(api_url="http://127.0.0.1:9", database_url=url, callback_url=URL,
                            callback_secrets=[NEW_SECRET, OLD_SECRET], **changes)


@pytest.fixture()
def dispatcher(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Dispatcher:
    url = f"sqlite:///{tmp_path}/callbacks.sqlite"
    upgrade_database(url)
    return Dispatcher(settings_for(url), enqueuer=ListEnqueuer())


def callbacks(dispatcher: Dispatcher) -> list[Callback]:
    with dispatcher.sessions() as session:
        return list(session.scalars(select(Callback).order_by(Callback.id)))


def sent_and_delivered(dispatcher: Dispatcher, event_id: str) -> None:
    """The first attempt is accepted, then reported sent and delivered (the moves as the worker and
    the consumer run them)."""
    now = datetime.now(UTC)
    with dispatcher.sessions.begin() as session:
        notification = store.find_notification_by_event(session, event_id)
        assert notification is not None
        attempt = moves.open_attempt(session, notification_id=notification.id, number=1, route="reminders",
                                     channel="messaging_platform", now=now)
        assert moves.claim(session, notification_id=notification.id, attempt_id=attempt.id, fallback=False, now=now,
                           target=moves.Target(1, 1, 1, "messaging_platform", "h" * 64),
                           lease_until=now + timedelta(seconds=60), seen_claims=0)
        assert moves.accept(session, notification_id=notification.id, attempt_id=attempt.id, message_id=77,
                            state=moves.AttemptState.ACCEPTED, now=now, next_read_at=None)
    for current, new in (("accepted", "sent"), ("sent", "delivered"), ("sent", "delivered")):  # the last one: a repeat
        with dispatcher.sessions.begin() as session:
            moves.record_outcome(session, notification_id=notification.id, attempt_id=attempt.id, attempt_number=1,
                                 current=moves.AttemptState(current), new=moves.AttemptState(new),
                                 external_error=None, now=now)


def test_each_state_change_a_host_is_told_of_is_written_once_in_order(dispatcher: Dispatcher) -> None:
    dispatcher.notify(reminder("cb-1", identifier="p1", phone=PHONE))
    assert callbacks(dispatcher) == []  # queued: nothing to tell yet
    sent_and_delivered(dispatcher, "cb-1")
    dispatcher.notify(reminder("cb-2", identifier="p2", phone=PHONE))
    dispatcher.cancel("cb-2")
    rows = [(c.event_id, c.type, c.sequence, c.attempt, c.state, c.status) for c in callbacks(dispatcher)]
    assert rows == [
        ("cb-1", "notification.accepted", 1, 1, "accepted", "pending"),
        ("cb-1", "notification.sent", 2, 1, "sent", "pending"),
        ("cb-1", "notification.delivered", 3, 1, "delivered", "pending"),
        ("cb-2", "notification.cancelled", 1, 1, "cancelled", "pending"),
    ]


def test_without_a_callback_url_nothing_is_written(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/off.sqlite"
    upgrade_database(url)
    off = Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=url), enqueuer=ListEnqueuer())
    off.notify(reminder("cb-off", identifier="p", phone=PHONE))
    off.cancel("cb-off")
    assert callbacks(off) == []


def test_the_signature_verifies_with_the_standard_webhooks_library_under_either_secret() -> None:
    body = b'{"type":"notification.sent"}'
    signed = headers([SecretStr(NEW_SECRET), SecretStr(OLD_SECRET)], webhook_id="msg_1",
                     timestamp=int(datetime.now(UTC).timestamp()), body=body)
    for secret in (NEW_SECRET, OLD_SECRET):
        assert Webhook(secret).verify(body, signed) == {"type": "notification.sent"}
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + base64.b64encode(b"x" * 32).decode()).verify(body, signed)


class Host:
    """The host's endpoint, behind httpx.MockTransport: verifies each delivery with the library."""

    def __init__(self, answer: Callable[[], int] = lambda: 204) -> None:
        self.answer = answer
        self.received: list[dict[str, object]] = []
        self.ids: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        payload = Webhook(OLD_SECRET).verify(request.content, dict(request.headers))
        self.received.append(payload)
        self.ids.append(request.headers["webhook-id"])
        return httpx.Response(self.answer())


def deliver(dispatcher: Dispatcher, host: Host, at: datetime) -> DeliveryReport:
    with httpx.Client(transport=httpx.MockTransport(host)) as client:
        return deliver_due(dispatcher.sessions, dispatcher.settings, client, clock=lambda: at, rng=random.Random(1))


def test_events_are_delivered_signed_and_carry_nothing_private(dispatcher: Dispatcher) -> None:
    dispatcher.notify(reminder("cb-3", identifier="p3", phone=PHONE))
    sent_and_delivered(dispatcher, "cb-3")
    host = Host()
    report = deliver(dispatcher, host, datetime.now(UTC))
    assert report.delivered == 3
    assert [p["type"] for p in host.received] == ["notification.accepted", "notification.sent", "notification.delivered"]
    data = host.received[2]["data"]
    assert isinstance(data, dict) and data["event_id"] == "cb-3" and data["sequence"] == 3 and data["attempt"] == 1
    assert PHONE not in json.dumps(host.received) and "appointment" not in json.dumps(host.received)
    assert {c.status for c in callbacks(dispatcher)} == {"delivered"}
    assert deliver(dispatcher, host, datetime.now(UTC)).delivered == 0  # delivered once


def test_a_failing_host_is_tried_again_later_then_paused_and_resumed(dispatcher: Dispatcher) -> None:
    dispatcher.notify(reminder("cb-4", identifier="p4", phone=PHONE))
    dispatcher.cancel("cb-4")
    failing = Host(lambda: 503)
    start = datetime.now(UTC)
    deliver(dispatcher, failing, start)
    [row] = callbacks(dispatcher)
    assert (row.status, row.tries, row.last_error) == ("pending", 1, "answered 503")
    assert row.next_try_at is not None and timedelta(seconds=2) <= row.next_try_at - start <= timedelta(seconds=6)
    assert deliver(dispatcher, failing, start + timedelta(seconds=1)).failed == 0  # not due yet: backoff
    later = start + timedelta(seconds=dispatcher.settings.callback_pause_after_s + 60)
    report = deliver(dispatcher, failing, later)
    assert report.paused_urls == 1
    with dispatcher.sessions() as session:
        [endpoint] = outbox.endpoints(session)
    assert endpoint.paused_at is not None and endpoint.reason is not None and "answered 503" in endpoint.reason
    assert URL not in (endpoint.reason or "") and endpoint.url_key == outbox.url_key(URL)
    working = Host()
    report = deliver(dispatcher, working, later + timedelta(hours=2))
    assert report.parked == 1 and working.received == []  # paused: nothing is sent to it
    with dispatcher.sessions.begin() as session:
        assert outbox.resume(session, now=later + timedelta(hours=2)) == (1, 1)
    assert deliver(dispatcher, working, later + timedelta(hours=2)).delivered == 1


def test_an_event_past_its_age_expires_and_a_replay_sends_it_again_under_its_id(dispatcher: Dispatcher) -> None:
    dispatcher.notify(reminder("cb-5", identifier="p5", phone=PHONE))
    dispatcher.cancel("cb-5")
    late = datetime.now(UTC) + timedelta(seconds=dispatcher.settings.callback_max_age_s + 1)
    assert deliver(dispatcher, Host(), late).expired == 1
    [row] = callbacks(dispatcher)
    assert row.status == "expired" and row.last_error is not None and "callback_max_age_s" in row.last_error
    with dispatcher.sessions.begin() as session:
        assert outbox.replay(session, "cb-5", now=late) == 1
    host = Host()
    with dispatcher.sessions.begin() as session:  # replayed events are new again: their age counts from the replay
        session.execute(outbox.CALLBACKS.update().values(occurred_at=late))
    assert deliver(dispatcher, host, late).delivered == 1
    assert host.ids == [f"msg_{row.id}"]


def test_the_callbacks_commands_list_resume_and_replay(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import dispatcher.service as service
    from dispatcher.operations.cli.main import cli
    from tests.conftest import REPO_ROOT

    url = f"sqlite:///{tmp_path}/cli.sqlite"
    upgrade_database(url)
    clean_environment.setattr(service, "_default", None)
    for key, value in {"CONFIG": str(REPO_ROOT / "config" / "dispatcher.example.toml"), "DATABASE_URL": url,
                       "BROKER_URL": "memory://", "CALLBACK_URL": URL, "CALLBACK_SECRETS": NEW_SECRET}.items():
        clean_environment.setenv(f"DISPATCHER_{key}", value)
    service.default_dispatcher().notify(reminder("cb-cli", identifier="p", phone=PHONE))
    service.default_dispatcher().cancel("cb-cli")
    runner = CliRunner()
    listed = runner.invoke(cli, ["callbacks", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    [line] = [json.loads(text) for text in listed.output.splitlines()]
    assert (line["event_id"], line["type"], line["status"]) == ("cb-cli", "notification.cancelled", "pending")
    assert "secret-in-url" not in listed.output
    assert runner.invoke(cli, ["callbacks", "retry"]).output == "resumed 0 URL(s); 0 callback(s) due now\n"
    assert runner.invoke(cli, ["callbacks", "replay", "cb-cli"]).output == "cb-cli: 1 callback(s) due again\n"
    missing = runner.invoke(cli, ["callbacks", "replay", "nothing"])
    assert (missing.exit_code, missing.output) == (1, "error: no callbacks for event_id 'nothing'\n")


def test_the_examples_in_the_docs_work_as_written(clean_environment: pytest.MonkeyPatch) -> None:
    import tomllib

    from tests.conftest import REPO_ROOT

    text = (REPO_ROOT / "docs" / "callbacks.md").read_text()
    configured = tomllib.loads(text.split("```toml\n")[1].split("```")[0])
    configured.pop("routes")  # the doc shows only the key a route adds
    settings = example_settings(api_url="http://127.0.0.1:9", **configured)
    assert settings.callbacks_on and settings.callback_url_for("reminders") == configured["callback_url"]
    namespace: dict[str, object] = {}
    exec(compile(text.split("```python\n")[1].split("```")[0], "docs/callbacks.md", "exec"), namespace)  # noqa: S102
    body = b'{"type":"notification.read"}'
    signed = headers(settings.callback_secrets, webhook_id="msg_9", timestamp=int(datetime.now(UTC).timestamp()), body=body)
    receive = namespace["receive"]
    assert callable(receive) and receive(body, signed) == {"type": "notification.read"}


def test_retention_forgets_told_events_and_keeps_pending_ones(dispatcher: Dispatcher) -> None:
    from dispatcher.lifecycle.retention import purge

    for event_id in ("cb-old-1", "cb-old-2"):
        dispatcher.notify(reminder(event_id, identifier=event_id, phone=PHONE))
        dispatcher.cancel(event_id)
    with dispatcher.sessions.begin() as session:
        first = min(c.id for c in session.scalars(select(Callback)))
        outbox.delivered(session, [first], now=datetime.now(UTC))
    report = purge(dispatcher.sessions, retention_days=30, now=datetime.now(UTC) + timedelta(days=31),
                   hashing_key=dispatcher.settings.hashing_key, spent_days=365)
    assert report.callbacks == 1
    assert [c.event_id for c in callbacks(dispatcher)] == ["cb-old-2"]


def test_a_host_that_cannot_even_be_called_fails_only_its_own_events(dispatcher: Dispatcher) -> None:
    dispatcher.notify(reminder("cb-6", identifier="p6", phone=PHONE))
    dispatcher.cancel("cb-6")

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("a client that cannot even build the request")

    with httpx.Client(transport=httpx.MockTransport(unreachable)) as client:
        report = deliver_due(dispatcher.sessions, dispatcher.settings, client, clock=lambda: datetime.now(UTC))
    assert (report.failed, report.delivered) == (1, 0)
    [row] = callbacks(dispatcher)
    assert (row.status, row.last_error) == ("pending", "no answer (RuntimeError)")


def test_an_open_notification_keeps_its_callbacks_and_numbers_on(dispatcher: Dispatcher) -> None:
    from sqlalchemy import update

    from dispatcher.lifecycle.announce import announce
    from dispatcher.lifecycle.retention import purge
    from dispatcher.store.models import Notification

    dispatcher.notify(reminder("cb-7", identifier="p7", phone=PHONE))
    sent_and_delivered(dispatcher, "cb-7")
    with dispatcher.sessions.begin() as session:
        outbox.delivered(session, [c.id for c in session.scalars(select(Callback))], now=datetime.now(UTC))
        # still open (test code may set a state): a read report may come, so retention keeps it
        session.execute(update(Notification).where(Notification.event_id == "cb-7").values(state="sent"))
    later = datetime.now(UTC) + timedelta(days=31)
    purge(dispatcher.sessions, retention_days=30, now=later, hashing_key=dispatcher.settings.hashing_key, spent_days=365)
    assert [c.sequence for c in callbacks(dispatcher)] == [1, 2, 3]
    with dispatcher.sessions.begin() as session:
        session.execute(update(Notification).where(Notification.event_id == "cb-7").values(state="read"))
        notification_id = session.scalar(select(Notification.id).where(Notification.event_id == "cb-7"))
        assert notification_id is not None
        announce(session, notification_id, now=later)
    assert [(c.sequence, c.type) for c in callbacks(dispatcher)][-1] == (4, "notification.read")
