"""Webhook deliveries over real HTTP to a receiver in the test that checks signatures independently."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from sandbox_helpers import FAST_CONFIG, Api, WebhookReceiver, wait_for

from tests.support.sandbox_process import SandboxProcess, running_sandbox

pytestmark = pytest.mark.integration
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
ALL_EVENTS = ["message_created", "message_updated", "conversation_created", "contact_created"]


def subscribe(api: Api, receiver: WebhookReceiver, events: list[str] = ALL_EVENTS) -> dict:
    hook = api.webhook(receiver.url, events)
    receiver.secret = hook["secret"]
    return hook


@pytest.fixture()
def configured(request: pytest.FixtureRequest) -> Iterator[tuple[SandboxProcess, Api]]:
    """A sandbox started with FAST_CONFIG plus the ``[webhooks]`` keys given by indirect parametrisation."""
    extra = getattr(request, "param", "")
    with running_sandbox(FAST_CONFIG.replace("[webhooks]", "[webhooks]\n" + extra)) as sb:
        client = Api(sb)
        yield sb, client
        client.close()


def test_signed_message_events_with_the_field_notes_shape(
    fast_api: Api, fast_sandbox: SandboxProcess, receiver: WebhookReceiver
) -> None:
    subscribe(fast_api, receiver)
    conv = fast_api.conversation(2, phone_number="+15558000001")
    first = fast_api.send(conv["id"], {"content": "first"}).json()
    second = fast_api.send(conv["id"], {"content": "second"}).json()
    wait_for(lambda: len(receiver.events("message_updated")) >= 4)

    assert all(r.signature_ok for r in receiver.events())
    created = next(r for r in receiver.events("message_created") if r.json["id"] == first["id"])
    headers = created.headers
    assert re.fullmatch(r"[0-9a-f-]{36}", headers["x-service-delivery"])
    assert abs(int(headers["x-service-timestamp"]) - time.time()) < 60
    assert re.fullmatch(r"sha256=[0-9a-f]{64}", headers["x-service-signature"])

    event = created.json
    assert event["message_type"] == "outgoing"
    assert ISO.match(event["created_at"])
    assert event["conversation"]["id"] == conv["id"]
    assert event["conversation"]["contact_inbox"]["id"] != conv["id"]
    assert event["inbox"] == {"id": 2, "name": "SMS"}
    assert event["account"] == {"id": 1, "name": "Demo Clinic"}
    assert event["status"] == "sent"
    assert {"content_attributes", "additional_attributes", "private", "source_id", "sender"} <= set(event)

    updates = [r.json for r in receiver.events("message_updated") if r.json["id"] == first["id"]]
    assert [u["status"] for u in updates] == ["delivered", "read"]
    last_update = receiver.events("message_updated")[-1].json
    assert last_update["conversation"]["messages"][0]["id"] == second["id"]  # latest, not necessarily this one


def test_contact_and_conversation_created_events(fast_api: Api, receiver: WebhookReceiver) -> None:
    subscribe(fast_api, receiver)
    conv = fast_api.conversation(5, identifier="ev-1")
    contact_event = wait_for(lambda: receiver.events("contact_created"))[0].json
    conversation_event = wait_for(lambda: receiver.events("conversation_created"))[0].json
    assert contact_event["identifier"] == "ev-1"
    assert conversation_event["id"] == conv["id"]
    assert conversation_event["contact_inbox"]["id"] != conv["id"]


def test_failed_attempt_reports_external_error(fast_api: Api, receiver: WebhookReceiver) -> None:
    subscribe(fast_api, receiver, ["message_updated"])
    conv = fast_api.conversation(1, phone_number="+15550109999")
    fast_api.send(conv["id"], {"content": "free text outside the window"})
    event = wait_for(lambda: receiver.events("message_updated"))[0].json
    assert event["status"] == "failed"
    assert event["content_attributes"]["external_error"].startswith("131047")


def test_incoming_message_fires_message_created(fast_api: Api, fast_sandbox: SandboxProcess, receiver: WebhookReceiver) -> None:
    subscribe(fast_api, receiver, ["message_created"])
    contact = fast_api.contact(1, phone_number="+15558000002")["contact"]
    fast_sandbox.incoming(contact_id=contact["id"], inbox_id=1, content="Can I move it?")
    event = wait_for(lambda: receiver.events("message_created"))[0].json
    assert (event["message_type"], event["content"]) == ("incoming", "Can I move it?")


def test_only_subscribed_events_are_sent(fast_api: Api, receiver: WebhookReceiver) -> None:
    subscribe(fast_api, receiver, ["message_updated"])
    conv = fast_api.conversation(5, identifier="sub-1")
    fast_api.send(conv["id"], {"content": "x"})
    wait_for(lambda: len(receiver.events()) >= 2)
    assert {r.json["event"] for r in receiver.events()} == {"message_updated"}


def test_a_slow_receiver_does_not_slow_the_api(fast_api: Api, receiver: WebhookReceiver) -> None:
    receiver.delay_s = 1.0
    subscribe(fast_api, receiver, ["message_created"])
    conv = fast_api.conversation(5, identifier="slow-1")
    began = time.monotonic()
    for _ in range(5):
        assert fast_api.send(conv["id"], {"content": "x"}).status_code == 200
    assert time.monotonic() - began < 0.9


@pytest.mark.parametrize("configured", ['header_prefix = "Chatwoot"\ninclude_status = false'], indirect=True)
def test_stock_dialect_headers_and_no_status(configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver) -> None:
    _, api = configured
    receiver.prefix = "Chatwoot"
    subscribe(api, receiver, ["message_created"])
    conv = api.conversation(5, identifier="stock")
    api.send(conv["id"], {"content": "x"})
    delivery = wait_for(lambda: receiver.events("message_created"))[0]
    assert delivery.signature_ok
    assert "x-chatwoot-delivery" in delivery.headers and "x-service-delivery" not in delivery.headers
    assert "status" not in delivery.json


@pytest.mark.parametrize("configured", ["max_retries = 3"], indirect=True)
def test_retry_keeps_the_delivery_id_and_resigns(configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver) -> None:
    sb, api = configured
    receiver.statuses = [500, 503]
    subscribe(api, receiver, ["contact_created"])
    api.contact(5, identifier="retry")
    wait_for(lambda: len(receiver.events()) == 3)
    attempts = receiver.events()
    assert len({a.headers["x-service-delivery"] for a in attempts}) == 1
    assert all(a.signature_ok for a in attempts)
    assert len({a.body for a in attempts}) == 1
    stats = wait_for(lambda: sb.stats()["webhooks"] if sb.stats()["webhooks"].get("delivered") else None)
    assert (stats["attempts"], stats["retries"], stats["delivered"]) == (3, 2, 1)


@pytest.mark.parametrize("configured", ["max_retries = 2"], indirect=True)
def test_retries_are_bounded(configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver) -> None:
    sb, api = configured
    receiver.statuses = [500] * 10
    subscribe(api, receiver, ["contact_created"])
    api.contact(5, identifier="give-up")
    wait_for(lambda: sb.stats()["webhooks"].get("gave_up") == 1)
    assert len(receiver.events()) == 3


@pytest.mark.parametrize("configured", ["drop_share = 1.0"], indirect=True)
def test_dropped_events_never_arrive(configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver) -> None:
    sb, api = configured
    subscribe(api, receiver, ["contact_created"])
    for n in range(3):
        api.contact(5, identifier=f"drop-{n}")
    wait_for(lambda: sb.stats()["webhooks"].get("dropped") == 3)
    assert receiver.events() == []


@pytest.mark.parametrize("configured", ["duplicate_share = 1.0"], indirect=True)
def test_duplicates_carry_the_same_body_and_their_own_delivery_id(
    configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver
) -> None:
    _, api = configured
    subscribe(api, receiver, ["contact_created"])
    api.contact(5, identifier="dup")
    wait_for(lambda: len(receiver.events()) == 2)
    first, second = receiver.events()
    assert first.body == second.body
    assert first.headers["x-service-delivery"] != second.headers["x-service-delivery"]


@pytest.mark.parametrize("configured", ["reorder_share = 1.0\nconcurrency = 1\nreorder_hold_s = 5.0"], indirect=True)
def test_reordered_events_arrive_after_the_next_one(configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver) -> None:
    _, api = configured
    subscribe(api, receiver, ["contact_created"])
    api.contact(5, identifier="first")
    api.contact(5, identifier="second")
    wait_for(lambda: len(receiver.events()) == 2)
    assert [r.json["identifier"] for r in receiver.events()] == ["second", "first"]


@pytest.mark.parametrize("configured", ["delay_s = 0.4"], indirect=True)
def test_delivery_delay(configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver) -> None:
    _, api = configured
    subscribe(api, receiver, ["contact_created"])
    sent_at = time.monotonic()
    api.contact(5, identifier="late")
    delivery = wait_for(lambda: receiver.events())[0]
    assert delivery.at - sent_at >= 0.35


def test_webhooks_to_other_hosts_are_stored_but_never_called(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    fast_api.webhook("https://example.invalid/hook", ["contact_created"])
    fast_api.contact(5, identifier="blocked")
    assert wait_for(lambda: fast_sandbox.stats()["webhooks"].get("blocked_host")) == 1
    assert fast_sandbox.stats()["webhooks"].get("attempts", 0) == 0


def test_the_seed_replays_secrets_after_reset(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    first = fast_api.webhook("http://127.0.0.1:9/a", ["message_created"])["secret"]
    fast_sandbox.reset()
    again = fast_api.webhook("http://127.0.0.1:9/a", ["message_created"])["secret"]
    assert first == again
