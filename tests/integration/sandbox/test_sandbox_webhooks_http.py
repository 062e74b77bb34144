"""Webhook deliveries over real HTTP to a receiver in the test that checks signatures independently.

The default profile is stock (``X-Chatwoot-*`` headers, no top-level status, never retried, HTML
characters escaped in the JSON); tests that name ``contract`` check the contract profile's shapes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterator

import pytest
from sandbox_helpers import FAST_CONFIG, Api, WebhookReceiver, wait_for

from tests.support.sandbox_process import SandboxProcess, running_sandbox

pytestmark = pytest.mark.integration
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
STOCK_CONTACT_KEYS = {"account", "additional_attributes", "avatar", "custom_attributes", "email", "id",
                      "identifier", "name", "phone_number", "thumbnail", "blocked"}
ALL_EVENTS = ["message_created", "message_updated", "conversation_created", "contact_created"]


def subscribe(api: Api, receiver: WebhookReceiver, events: list[str] = ALL_EVENTS) -> dict:
    hook = api.webhook(receiver.url, events)
    receiver.secret = hook["secret"]
    return hook


@pytest.fixture()
def configured(request: pytest.FixtureRequest) -> Iterator[tuple[SandboxProcess, Api]]:
    """A sandbox started with FAST_CONFIG plus the ``[webhooks]`` keys given by indirect parametrisation;
    a parameter ``(profile, keys)`` names the profile too."""
    param = getattr(request, "param", "")
    profile, extra = param if isinstance(param, tuple) else (None, param)
    with running_sandbox(FAST_CONFIG.replace("[webhooks]", "[webhooks]\n" + extra), profile=profile) as sb:
        client = Api(sb)
        yield sb, client
        client.close()


def independent_signature(secret: str, timestamp: str, body: bytes) -> str:
    """The field notes' rule, written here again: sha256= + hex HMAC-SHA256(secret, ts + "." + body)."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def test_signed_message_events_with_the_stock_shape(
    fast_api: Api, fast_sandbox: SandboxProcess, receiver: WebhookReceiver
) -> None:
    subscribe(fast_api, receiver)
    conv = fast_api.conversation(2, phone_number="+15558000001")
    first = fast_api.send(conv["id"], {"content": "first"}).json()
    second = fast_api.send(conv["id"], {"content": "second"}).json()
    # provider id and delivered for each of the two messages (an SMS is never read)
    wait_for(lambda: len(receiver.events("message_updated")) >= 4)

    assert all(r.signature_ok for r in receiver.events())
    created = next(r for r in receiver.events("message_created") if r.json["id"] == first["id"])
    headers = created.headers
    assert re.fullmatch(r"[0-9a-f-]{36}", headers["x-chatwoot-delivery"])
    assert abs(int(headers["x-chatwoot-timestamp"]) - time.time()) < 60
    assert re.fullmatch(r"sha256=[0-9a-f]{64}", headers["x-chatwoot-signature"])
    assert not any(name.startswith("x-service-") for name in headers)
    assert headers["content-type"] == "application/json"

    event = created.json
    assert event["message_type"] == "outgoing"  # a string in events
    assert ISO_MS.match(event["created_at"])  # ISO-8601 with milliseconds
    assert "status" not in event  # a client reads it from listMessages
    assert event["conversation"]["id"] == conv["id"]
    assert event["conversation"]["contact_inbox"]["id"] != conv["id"]
    assert event["inbox"] == {"id": 2, "name": "SMS"}
    assert event["account"] == {"id": 1, "name": "Demo Clinic"}
    assert {"content_attributes", "additional_attributes", "private", "source_id", "sender"} <= set(event)
    assert event["sender"]["type"] == "user"  # our own outgoing message

    updates = [r.json for r in receiver.events("message_updated") if r.json["id"] == first["id"]]
    assert len(updates) == 2 and all("status" not in u for u in updates)
    # each change touches the conversation: no two updates of one message carry the same body
    assert len({json.dumps(u, sort_keys=True) for u in updates}) == 2
    last_update = receiver.events("message_updated")[-1].json
    assert last_update["conversation"]["messages"][0]["id"] == second["id"]  # latest, not necessarily this one


def test_signed_message_events_with_the_contract_shape(configured_contract: tuple[SandboxProcess, Api]) -> None:
    _, api = configured_contract
    receiver = WebhookReceiver(prefix="Service")
    receiver.start()
    try:
        subscribe(api, receiver, ["message_created", "message_updated"])
        conv = api.conversation(2, phone_number="+15558000011")
        first = api.send(conv["id"], {"content": "first"}).json()
        wait_for(lambda: len(receiver.events("message_updated")) >= 2)
        created = receiver.events("message_created")[0]
        updates = [r.json for r in receiver.events("message_updated") if r.json["id"] == first["id"]]
    finally:
        receiver.stop()
    assert created.signature_ok
    assert "x-service-delivery" in created.headers and "x-chatwoot-delivery" not in created.headers
    event = created.json
    assert (event["message_type"], event["status"]) == (1, "sent")  # the Message resource's number
    assert isinstance(event["created_at"], int)
    assert event["sender"] == {"id": 1, "name": "Sandbox Integration", "type": "user"}
    # Made in this order, but delivered by concurrent senders (as a workspace does): a busy
    # machine may bring them in another order, which the consumer copes with (CI met one).
    assert sorted(u["status"] for u in updates) == ["delivered", "sent"]  # SMS: never read
    assert next(u for u in updates if u["status"] == "sent")["source_id"].startswith("SM")


@pytest.fixture()
def configured_contract() -> Iterator[tuple[SandboxProcess, Api]]:
    with running_sandbox(FAST_CONFIG, profile="contract") as sb:
        client = Api(sb)
        yield sb, client
        client.close()


@pytest.mark.parametrize(("inbox_id", "prefix", "pattern"), [(1, "wamid.", r"wamid\.[A-Za-z0-9+/=]+"), (2, "SM", r"SM[0-9a-f]{32}")])
def test_the_provider_message_id_is_announced_while_the_status_is_still_sent(
    fast_api: Api, fast_sandbox: SandboxProcess, receiver: WebhookReceiver, inbox_id: int, prefix: str, pattern: str
) -> None:
    # given a send on the platform (a template, so the window does not matter) or on SMS
    subscribe(fast_api, receiver, ["message_created", "message_updated"])
    conv = fast_api.conversation(inbox_id, phone_number=f"+1555800002{inbox_id}")
    body: dict = {"content": "Results are ready"}
    if inbox_id == 1:
        body["template_params"] = {"name": "test_results_ready", "language": "en", "category": "UTILITY",
                                   "processed_params": {"body": {"1": "Ana"}}}
    sent = fast_api.send(conv["id"], body).json()
    assert sent["source_id"] is None  # the answer comes before the provider's
    # then the first message_updated carries the provider's id, before any delivery report
    updates = wait_for(lambda: [r.json for r in receiver.events("message_updated") if r.json["id"] == sent["id"]])
    first = updates[0]
    assert re.fullmatch(pattern, first["source_id"])
    assert "status" not in first
    # and listMessages shows it as the message's source_id
    listed = fast_api.get(f"/conversations/{conv['id']}/messages").json()["payload"]
    assert next(m for m in listed if m["id"] == sent["id"])["source_id"] == first["source_id"]


def test_a_message_the_provider_refuses_at_once_gets_no_provider_id(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    conv = fast_api.conversation(1, phone_number="+15558000031")
    body = {"content": "x", "template_params": {"name": "no_such_template", "language": "en", "category": "UTILITY",
                                                "processed_params": {"body": {"1": "x"}}}}
    sent = fast_api.send(conv["id"], body).json()
    row = wait_for(lambda: next((m for m in fast_sandbox.messages() if m["id"] == sent["id"] and m["status"] == "failed"), None))
    assert row["external_error"].startswith("132001") and row["source_id"] is None


def test_stock_json_escapes_html_characters_and_a_reserialising_verifier_fails(
    fast_api: Api, receiver: WebhookReceiver
) -> None:
    # given a message whose content holds <, > and & and a non-ASCII letter
    subscribe(fast_api, receiver, ["message_created"])
    conv = fast_api.conversation(5, identifier="escape")
    fast_api.send(conv["id"], {"content": "<b>Tom & Jerry</b> í"})
    delivery = wait_for(lambda: receiver.events("message_created"))[0]
    raw, timestamp = delivery.body, delivery.headers["x-chatwoot-timestamp"]
    # then the raw body carries the stock escapes and raw UTF-8 ...
    assert b"\\u003cb\\u003eTom \\u0026 Jerry\\u003c/b\\u003e \xc3\xad" in raw
    # ... the signature, checked here independently, covers exactly those bytes ...
    assert delivery.headers["x-chatwoot-signature"] == independent_signature(receiver.secret, timestamp, raw)
    # ... and a receiver that parses and re-serialises the body before verifying fails
    reserialised = json.dumps(json.loads(raw), separators=(",", ":"), ensure_ascii=False).encode()
    assert reserialised != raw
    assert delivery.headers["x-chatwoot-signature"] != independent_signature(receiver.secret, timestamp, reserialised)


def test_contact_and_conversation_created_events(fast_api: Api, receiver: WebhookReceiver) -> None:
    subscribe(fast_api, receiver)
    conv = fast_api.conversation(5, identifier="ev-1")
    contact_event = wait_for(lambda: receiver.events("contact_created"))[0].json
    conversation_event = wait_for(lambda: receiver.events("conversation_created"))[0].json
    assert contact_event["identifier"] == "ev-1"
    assert conversation_event["id"] == conv["id"]
    assert conversation_event["contact_inbox"]["id"] != conv["id"]


def test_failed_attempt_reports_external_error(
    fast_api: Api, fast_sandbox: SandboxProcess, receiver: WebhookReceiver
) -> None:
    subscribe(fast_api, receiver, ["message_updated"])
    conv = fast_api.conversation(1, phone_number="+15550109999")
    sent = fast_api.send(conv["id"], {"content": "free text outside the window"}).json()

    def failure() -> dict | None:
        events = [r.json for r in receiver.events("message_updated")]
        return next((e for e in events if e["content_attributes"].get("external_error")), None)

    event = wait_for(failure)
    assert "status" not in event  # stock: the failed status is read from the message list
    assert event["content_attributes"]["external_error"].startswith("131047")
    assert [m["status"] for m in fast_sandbox.messages() if m["id"] == sent["id"]] == ["failed"]


def test_incoming_message_fires_message_created_with_the_stock_contact_as_sender(
    fast_api: Api, fast_sandbox: SandboxProcess, receiver: WebhookReceiver
) -> None:
    subscribe(fast_api, receiver, ["message_created"])
    contact = fast_api.contact(1, phone_number="+15558000002", name="Ana", email="ana@example.org")["contact"]
    fast_sandbox.incoming(contact_id=contact["id"], inbox_id=1, content="Can I move it?")
    event = wait_for(lambda: receiver.events("message_created"))[0].json
    assert (event["message_type"], event["content"]) == ("incoming", "Can I move it?")
    assert ISO_MS.match(event["created_at"])
    sender = event["sender"]
    assert set(sender) == STOCK_CONTACT_KEYS  # no "type" key
    assert (sender["id"], sender["phone_number"], sender["account"]) == (contact["id"], "+15558000002", {"id": 1, "name": "Demo Clinic"})


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


@pytest.mark.parametrize("configured", [('contract', 'header_prefix = "Chatwoot"\ninclude_status = false')], indirect=True)
def test_profile_settings_can_be_overridden_one_by_one(configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver) -> None:
    _, api = configured
    subscribe(api, receiver, ["message_created"])
    conv = api.conversation(5, identifier="stock")
    api.send(conv["id"], {"content": "x"})
    delivery = wait_for(lambda: receiver.events("message_created"))[0]
    assert delivery.signature_ok
    assert "x-chatwoot-delivery" in delivery.headers and "x-service-delivery" not in delivery.headers
    assert "status" not in delivery.json
    assert delivery.json["message_type"] == 1  # the rest stays the contract profile's


def test_stock_tries_a_delivery_once_and_never_retries(fast_sandbox: SandboxProcess, fast_api: Api, receiver: WebhookReceiver) -> None:
    # given a receiver that answers 500, on the stock profile (no retries)
    receiver.statuses = [500] * 5
    subscribe(fast_api, receiver, ["contact_created"])
    fast_api.contact(5, identifier="no-retry")
    # then one attempt is made and the sandbox gives up on it
    stats = wait_for(lambda: fast_sandbox.stats()["webhooks"] if fast_sandbox.stats()["webhooks"].get("gave_up") else None)
    assert (stats["attempts"], stats.get("retries", 0), stats["gave_up"]) == (1, 0, 1)
    assert len(receiver.events()) == 1


def test_stock_waits_5_s_for_a_receiver_then_gives_up_without_retrying(receiver: WebhookReceiver) -> None:
    # given the stock profile at its default timeout, a receiver that answers after 4 s and one after 6 s
    patient = WebhookReceiver(delay_s=4.0)
    patient.start()
    try:
        with running_sandbox() as sb, Api(sb) as api:
            receiver.delay_s = 6.0
            subscribe(api, receiver, ["contact_created"])
            subscribe(api, patient, ["contact_created"])
            api.contact(5, identifier="slow")
            # then the 4 s answer is taken, the 6 s one times out, and neither is tried again
            wait_for(lambda: sb.stats()["webhooks"].get("gave_up") and sb.stats()["webhooks"].get("delivered"), timeout_s=15)
            wait_for(lambda: receiver.events(), timeout_s=10)  # the slow handler finishes its one request
            stats = sb.stats()["webhooks"]
    finally:
        patient.stop()
    assert (stats["attempts"], stats["delivered"], stats["failed_attempts"], stats.get("retries", 0)) == (2, 1, 1, 0)
    assert len(receiver.events()) == len(patient.events()) == 1


@pytest.mark.parametrize("configured", [("contract", "max_retries = 3")], indirect=True)
def test_retry_keeps_the_delivery_id_and_resigns(configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver) -> None:
    sb, api = configured
    receiver.prefix = "Service"
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


@pytest.mark.parametrize("configured", [("contract", "")], indirect=True)
def test_contract_retries_are_bounded_at_2(configured: tuple[SandboxProcess, Api], receiver: WebhookReceiver) -> None:
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
    assert first.headers["x-chatwoot-delivery"] != second.headers["x-chatwoot-delivery"]


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
