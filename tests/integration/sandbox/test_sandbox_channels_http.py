"""Channel behaviour over HTTP: status progression, recipient rules, templates, window, caps."""

from __future__ import annotations

import json

import httpx
import pytest
from sandbox_helpers import FAST_CONFIG, Api, message_status, wait_for

from tests.support.fixtures import EXAMPLES
from tests.support.sandbox_process import SandboxProcess, running_sandbox

pytestmark = pytest.mark.integration

REMINDER = {
    "name": "appointment_reminder",
    "category": "UTILITY",
    "language": "en",
    "processed_params": {"body": {"1": "Ana", "2": "10:00"}},
}


def final_message(sb: SandboxProcess, message_id: int, *, status: str) -> dict:
    """Wait until the message reaches ``status``; return its row from the contract's listMessages."""
    wait_for(lambda: message_status(sb, message_id) == status)
    row = next(m for m in sb.messages() if m["id"] == message_id)
    return row


def listed(api: Api, conversation_id: int, message_id: int) -> dict:
    payload = api.get(f"/conversations/{conversation_id}/messages").json()["payload"]
    return next(m for m in payload if m["id"] == message_id)


def test_outgoing_message_goes_sent_delivered_read(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    conv = fast_api.conversation(5, phone_number="+15557000001")  # an API inbox: its channel reports read
    message = fast_api.send(conv["id"], {"content": "Your results are ready."}).json()
    assert message["status"] == "sent"
    final_message(fast_sandbox, message["id"], status="read")  # the order is checked by webhook tests
    assert listed(fast_api, conv["id"], message["id"])["status"] == "read"


@pytest.mark.parametrize(("inbox_id", "contact"), [(2, {"phone_number": "+15557000011"}),
                                                   (3, {"email": "delivered-only@example.com"})])
def test_sms_and_email_end_delivered_never_read(fast_api: Api, fast_sandbox: SandboxProcess, inbox_id: int,
                                                contact: dict[str, str]) -> None:
    """The SMS provider and the mail server know nothing of a read: delivered is the last status."""
    conv = fast_api.conversation(inbox_id, **contact)
    message = fast_api.send(conv["id"], {"content": "Your results are ready."}).json()
    other = fast_api.conversation(5, phone_number="+15557000012")
    later = fast_api.send(other["id"], {"content": "b"}).json()
    final_message(fast_sandbox, message["id"], status="delivered")
    final_message(fast_sandbox, later["id"], status="read")  # sent after it, and read: well past every delay
    assert listed(fast_api, conv["id"], message["id"])["status"] == "delivered"


def test_recipient_rule_fails_with_external_error_in_both_places(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    conv = fast_api.conversation(1, phone_number="+15550101234")
    message = fast_api.send(conv["id"], {"content": "Reminder", "template_params": REMINDER})
    assert message.status_code == 200  # failures are reported asynchronously, like the real service
    final_message(fast_sandbox, message.json()["id"], status="failed")
    row = listed(fast_api, conv["id"], message.json()["id"])
    assert row["external_error"].startswith("131026")
    assert row["content_attributes"]["external_error"] == row["external_error"]
    # The rule is the platform's ("not on the platform"): SMS to the same number is delivered
    sms = fast_api.conversation(2, phone_number="+15550101235")  # same prefix, its own contact
    delivered = fast_api.send(sms["id"], {"content": "Reminder"}).json()
    final_message(fast_sandbox, delivered["id"], status="delivered")


def test_never_confirmed_recipient_stays_sent(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    never = fast_api.conversation(2, phone_number="+15550201234")
    normal = fast_api.conversation(2, phone_number="+15550301234")
    stuck = fast_api.send(never["id"], {"content": "a"}).json()
    moving = fast_api.send(normal["id"], {"content": "b"}).json()
    final_message(fast_sandbox, moving["id"], status="delivered")  # well past every configured delay
    assert message_status(fast_sandbox, stuck["id"]) == "sent"


@pytest.mark.parametrize(
    ("template", "code"),
    [
        ({**REMINDER, "name": "no_such_template"}, "132001"),
        ({**REMINDER, "language": "de"}, "132001"),
        ({**REMINDER, "processed_params": {"body": {"1": "Ana"}}}, "132000"),
        ({**REMINDER, "processed_params": {"1": "Ana", "2": "10:00", "3": "x"}}, "132000"),
    ],
)
def test_platform_template_errors(fast_api: Api, fast_sandbox: SandboxProcess, template: dict, code: str) -> None:
    conv = fast_api.conversation(1, phone_number="+15557000002")
    message = fast_api.send(conv["id"], {"content": "Reminder", "template_params": template})
    assert message.status_code == 200
    row = final_message(fast_sandbox, message.json()["id"], status="failed")
    assert row["external_error"].startswith(code)


@pytest.mark.parametrize(
    "processed_params",
    [{"body": {"1": "Ana", "2": "10:00"}}, {"1": "Ana", "2": "10:00"}, {"body": {"1": "a", "2": "b"}, "header": {}}],
)
def test_platform_template_accepts_both_parameter_shapes(
    fast_api: Api, fast_sandbox: SandboxProcess, processed_params: dict
) -> None:
    conv = fast_api.conversation(1, phone_number="+15557000003")
    body = {"content": "Reminder", "template_params": {**REMINDER, "processed_params": processed_params}}
    message = fast_api.send(conv["id"], body).json()
    row = final_message(fast_sandbox, message["id"], status="read")
    assert row["template_name"] == "appointment_reminder"


def test_spanish_template_and_one_param_template(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    conv = fast_api.conversation(1, phone_number="+15557000004")
    es = fast_api.send(conv["id"], {"content": "x", "template_params": {**REMINDER, "language": "es"}}).json()
    ready = {"name": "test_results_ready", "category": "UTILITY", "language": "en", "processed_params": {"body": {"1": "Ana"}}}
    one = fast_api.send(conv["id"], {"content": "y", "template_params": ready}).json()
    final_message(fast_sandbox, es["id"], status="read")
    final_message(fast_sandbox, one["id"], status="read")


def test_shared_template_example_body_shape_is_accepted(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    body = json.loads((EXAMPLES / "swagger_message_create_whatsapp_template_image_header.request.json").read_text())
    conv = fast_api.conversation(1, phone_number="+15557000005")
    response = fast_api.send(conv["id"], body)
    assert response.status_code == 200
    row = final_message(fast_sandbox, response.json()["id"], status="failed")
    assert row["external_error"].startswith("132001")  # order_confirmation is not approved here


def test_free_text_on_platform_needs_the_service_window(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    conv = fast_api.conversation(1, phone_number="+15557000006")
    closed = fast_api.send(conv["id"], {"content": "free text"}).json()
    assert final_message(fast_sandbox, closed["id"], status="failed")["external_error"].startswith("131047")

    contact_id = fast_sandbox.messages(conversation_id=conv["id"])[0]["contact_id"]
    fast_sandbox.incoming(contact_id=contact_id, inbox_id=1, conversation_id=conv["id"], age_s=25 * 3600)
    stale = fast_api.send(conv["id"], {"content": "still closed"}).json()
    assert final_message(fast_sandbox, stale["id"], status="failed")["external_error"].startswith("131047")

    fast_sandbox.incoming(contact_id=contact_id, inbox_id=1, conversation_id=conv["id"])
    opened = fast_api.send(conv["id"], {"content": "now allowed"}).json()
    final_message(fast_sandbox, opened["id"], status="read")


def test_incoming_message_is_type_0_in_the_list(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    created = fast_api.contact(1, phone_number="+15557000007")
    result = fast_sandbox.incoming(contact_id=created["contact"]["id"], inbox_id=1, content="Yes, I'll come")
    payload = fast_api.get(f"/conversations/{result['conversation_id']}/messages").json()["payload"]
    assert [(m["message_type"], m["content"]) for m in payload] == [(0, "Yes, I'll come")]


def test_outgoing_message_with_source_id_is_stored_but_never_sent(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    conv = fast_api.conversation(2, phone_number="+15557000008")
    echo = fast_api.send(conv["id"], {"content": "echo", "source_id": "wamid.123"}).json()
    normal = fast_api.send(conv["id"], {"content": "normal"}).json()
    final_message(fast_sandbox, normal["id"], status="delivered")
    row = next(m for m in fast_sandbox.messages() if m["id"] == echo["id"])
    assert (row["status"], row["dispatched"], row["source_id"]) == ("sent", False, "wamid.123")


def test_web_session_inbox_refuses_more_than_10_sends_a_minute(fast_api: Api, fast_sandbox: SandboxProcess) -> None:
    conv = fast_api.conversation(4, phone_number="+15557000009")
    statuses = [fast_api.send(conv["id"], {"content": f"n{n}"}).status_code for n in range(10)]
    refused = fast_api.send(conv["id"], {"content": "one too many"})
    assert statuses == [200] * 10
    assert refused.status_code == 429
    assert refused.text == "Retry later"
    assert refused.headers["content-type"].startswith("text/plain")
    assert "retry-after" not in refused.headers
    assert len(fast_sandbox.messages(inbox_id=4)) == 10


def test_web_session_cap_can_fail_the_message_instead() -> None:
    with running_sandbox(FAST_CONFIG.replace("[behaviour]", '[behaviour]\nover_send_cap = "fail"')) as sb:
        api = Api(sb)
        conv = api.conversation(4, phone_number="+15557000010")
        for n in range(10):
            api.send(conv["id"], {"content": f"n{n}"})
        over = api.send(conv["id"], {"content": "one too many"})
        assert over.status_code == 200
        assert final_message(sb, over.json()["id"], status="failed")["external_error"].startswith("130429")
        api.close()


def test_too_many_messages_in_a_conversation_is_422() -> None:
    config = FAST_CONFIG.replace("[behaviour]", "[behaviour]\nconversation_messages_per_minute = 5")
    with running_sandbox(config) as sb:
        api = Api(sb)
        conv = api.conversation(5, identifier="chatty")
        statuses = [api.send(conv["id"], {"content": "x"}).status_code for _ in range(5)]
        sixth = api.send(conv["id"], {"content": "x"})
        other = api.conversation(5, identifier="quiet")
        assert api.send(other["id"], {"content": "x"}).status_code == 200
        api.close()
    assert statuses == [200] * 5
    assert sixth.status_code == 422
    assert sixth.json()["error"] == "Too many messages"


def test_initial_status_can_be_null() -> None:
    config = FAST_CONFIG.replace("[behaviour]", '[behaviour]\ninitial_status = "null"')
    with running_sandbox(config) as sb:
        api = Api(sb)
        conv = api.conversation(5, identifier="n")
        message = api.send(conv["id"], {"content": "x"}).json()
        assert message["status"] is None
        final_message(sb, message["id"], status="read")
        api.close()


def test_default_seed_is_what_the_dispatcher_example_relies_on(sandbox: SandboxProcess) -> None:
    inboxes = httpx.get(f"{sandbox.api_url}/inboxes", headers=sandbox.headers, trust_env=False).json()["payload"]
    assert {(i["id"], i["name"]) for i in inboxes} == {
        (1, "WhatsApp Reminders"),
        (2, "SMS"),
        (3, "Email"),
        (4, "Web Session"),
        (5, "Patient Portal API"),
    }
