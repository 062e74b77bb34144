"""The sandbox answers as docs/openapi/messaging-api.yaml says the service does.

schemathesis generates requests for all ten operations from the description and checks every answer:
no 5xx, a documented status, the documented content type (JSON, ``text/plain`` for 429) and a body
that validates against the documented schema. Hand-written cases add what random data rarely reaches:
each operation's success path, refusals (no token, wrong token, another account's token, unknown
account), known error statuses, and 429 for every operation.

Every test runs against both profiles of the sandbox, stock (the default) and contract: one
sandbox process per profile serves the module (default seed: account 1 with inboxes 1..5, account
2 with inbox 6). Generation is bounded (``MAX_EXAMPLES`` per operation, no shrinking) so the file runs in
well under a minute. A finding against the sandbox goes to /tmp/handoff/sandbox-conformance.md;
the test stays as the contract wants it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.openapi import SPEC_PATH, validation_errors
from tests.support.sandbox_process import (
    DEFAULT_ACCOUNT_ID,
    DEFAULT_TOKEN,
    OTHER_TOKEN,
    SandboxProcess,
    running_sandbox,
)

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 12
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
OPERATION_IDS = (
    "listInboxes",
    "searchContacts",
    "createContact",
    "listContactableInboxes",
    "listConversations",
    "createConversation",
    "listMessages",
    "createMessage",
    "listWebhooks",
    "createWebhook",
)
SEEDED_INBOXES = (1, 2, 3, 4, 5)  # account 1; inbox 6 belongs to account 2
OTHER_ACCOUNT_INBOX = 6
UNKNOWN_ID = 987_654_321
APPROVED_TEMPLATE = {
    "name": "appointment_reminder",
    "category": "UTILITY",
    "language": "en",
    "processed_params": {"body": {"1": "Anna", "2": "10:30"}},
}
# Webhook deliveries may only go to loopback; port 9 (discard) refuses, which is harmless here.
HOOK_URL = "http://127.0.0.1:9/conformance-hooks"

CONFIG = schemathesis.Config.from_dict(
    {
        "generation": {
            "mode": "positive",
            "max-examples": MAX_EXAMPLES,
            "no-shrink": True,
            # The token is sent by the test itself, never generated.
            "with-security-parameters": False,
            "database": "none",
        },
        "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
        # Every path is scoped to the seeded account; other accounts are exercised by hand below.
        "parameters": {"path.account_id": DEFAULT_ACCOUNT_ID},
        # No .schemathesis/ crash cache in the work tree: each run stands on its own.
        "cache": {"enabled": False},
    }
)
schema = schemathesis.openapi.from_path(SPEC_PATH, config=CONFIG)

_unique = itertools.count(1)


def _auth(token: str | None) -> dict[str, str]:
    return {} if token is None else {"api_access_token": token}


@pytest.fixture(scope="module", params=["stock", "contract"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[SandboxProcess]:
    with running_sandbox(profile=request.param) as handle:
        yield handle


@pytest.fixture(scope="module")
def known(sandbox: SandboxProcess) -> dict[str, Any]:
    """A contact and a conversation in the platform inbox, made through the contract itself."""
    with httpx.Client(base_url=sandbox.api_url, headers=sandbox.headers, timeout=10, trust_env=False) as client:
        created = client.post(
            "/contacts",
            json={
                "inbox_id": 1,
                "name": "Conformance Probe",
                "phone_number": "+15550990001",
                "identifier": "conformance-probe-1",
                "email": "probe@example.com",
            },
        )
        assert created.status_code == 200, created.text
        contact = created.json()["payload"]
        source_id = contact["contact_inbox"]["source_id"]
        conversation = client.post(
            "/conversations",
            json={"source_id": source_id, "inbox_id": 1, "contact_id": contact["contact"]["id"]},
        )
        assert conversation.status_code == 200, conversation.text
    return {
        "contact_id": contact["contact"]["id"],
        "source_id": source_id,
        "conversation_id": conversation.json()["id"],
        "identifier": "conformance-probe-1",
    }


# --- generated cases --------------------------------------------------------------------------


def _steer(case: schemathesis.Case, known: dict[str, Any], data: st.DataObject) -> None:
    """Point some generated cases at records that exist, so success paths are reached too.

    Random integers almost never name an existing contact, conversation or inbox: without this the
    run would check little but 404s. The generated value stays one of the choices.
    """
    params = case.path_parameters or {}
    if "contact_id" in params:
        params["contact_id"] = data.draw(st.sampled_from([known["contact_id"], params["contact_id"]]))
    if "conversation_id" in params:
        params["conversation_id"] = data.draw(st.sampled_from([known["conversation_id"], params["conversation_id"]]))
    if case.query and "inbox_id" in case.query:
        case.query["inbox_id"] = data.draw(st.sampled_from([*SEEDED_INBOXES, case.query["inbox_id"]]))
    body = case.body
    if not isinstance(body, dict):
        return
    operation_id = case.operation.definition.raw.get("operationId")
    if operation_id == "createContact":
        body["inbox_id"] = data.draw(st.sampled_from([*SEEDED_INBOXES, OTHER_ACCOUNT_INBOX, body["inbox_id"]]))
    elif operation_id == "createConversation":
        body["source_id"] = data.draw(st.sampled_from([known["source_id"], body["source_id"]]))
        if "contact_id" in body:
            body["contact_id"] = data.draw(st.sampled_from([known["contact_id"], body["contact_id"]]))
        if "inbox_id" in body:
            body["inbox_id"] = data.draw(st.sampled_from([1, body["inbox_id"]]))
    elif operation_id == "createMessage" and "template_params" in body:
        body["template_params"] = data.draw(st.sampled_from([APPROVED_TEMPLATE, body["template_params"]]))
    elif operation_id == "createWebhook":
        body["webhook"]["url"] = data.draw(st.sampled_from([HOOK_URL, body["webhook"]["url"]]))


@schema.parametrize()
@schema.given(data=st.data())
def test_generated_requests_conform(
    case: schemathesis.Case, data: st.DataObject, sandbox: SandboxProcess, known: dict[str, Any]
) -> None:
    # Given a request generated from the description, steered in part towards existing records
    _steer(case, known, data)
    # When it is sent with the seeded account's token, then the answer conforms to the description
    case.call_and_validate(base_url=sandbox.base_url, headers=_auth(DEFAULT_TOKEN), checks=CHECKS)


# --- hand-written cases -----------------------------------------------------------------------


def _request(operation_id: str, known: dict[str, Any], *, account_id: int = DEFAULT_ACCOUNT_ID) -> dict[str, Any]:
    """A valid request for each operation, aimed at records that exist."""
    n = next(_unique)
    path: dict[str, Any] = {"account_id": account_id}
    contact = {"inbox_id": 5, "name": f"Probe {n}", "identifier": f"probe-{n}", "phone_number": f"+1555098{n:04d}"}
    conversation = {"source_id": known["source_id"], "inbox_id": 1, "contact_id": known["contact_id"]}
    message = {"content": "Reminder: appointment tomorrow at 10:30", "template_params": APPROVED_TEMPLATE}
    # A URL of its own each time: a stock workspace refuses a URL the account already has (422).
    webhook = {"name": f"conformance {n}", "url": f"{HOOK_URL}/{n}", "subscriptions": ["message_created", "message_updated"]}
    requests: dict[str, dict[str, Any]] = {
        "listInboxes": {},
        "searchContacts": {"query": {"q": "Conformance", "page": 1}},
        "createContact": {"body": contact},
        "listContactableInboxes": {"path": {"contact_id": known["contact_id"]}},
        "listConversations": {"query": {"inbox_id": 1, "status": "all", "page": 1}},
        "createConversation": {"body": conversation},
        "listMessages": {"path": {"conversation_id": known["conversation_id"]}},
        "createMessage": {"path": {"conversation_id": known["conversation_id"]}, "body": message},
        "listWebhooks": {},
        "createWebhook": {"body": {"webhook": webhook}},
    }
    spec = requests[operation_id]
    result: dict[str, Any] = {"path_parameters": {**path, **spec.get("path", {})}}
    if "query" in spec:
        result["query"] = spec["query"]
    if "body" in spec:
        result["body"] = spec["body"]
        result["media_type"] = "application/json"
    return result


def _case(operation_id: str, known: dict[str, Any], **kwargs: Any) -> schemathesis.Case:
    return schema.find_operation_by_id(operation_id).Case(**_request(operation_id, known, **kwargs))


def _send(case: schemathesis.Case, sandbox: SandboxProcess, token: str | None) -> schemathesis.Response:
    return case.call_and_validate(base_url=sandbox.base_url, headers=_auth(token), checks=CHECKS)


@pytest.mark.parametrize("operation_id", OPERATION_IDS)
def test_success_path_conforms(operation_id: str, sandbox: SandboxProcess, known: dict[str, Any]) -> None:
    response = _send(_case(operation_id, known), sandbox, DEFAULT_TOKEN)
    assert response.status_code == 200, response.text


REFUSALS = {
    # name: (token, account_id, statuses the contract or the field notes allow)
    "no token": (None, DEFAULT_ACCOUNT_ID, {401}),
    "wrong token": ("not-a-token", DEFAULT_ACCOUNT_ID, {401}),
    "other account's token": (OTHER_TOKEN, DEFAULT_ACCOUNT_ID, {401, 403}),
    "unknown account": (DEFAULT_TOKEN, UNKNOWN_ID, {403, 404}),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
@pytest.mark.parametrize("operation_id", OPERATION_IDS)
def test_refusals_conform(operation_id: str, refusal: str, sandbox: SandboxProcess, known: dict[str, Any]) -> None:
    token, account_id, allowed = REFUSALS[refusal]
    response = _send(_case(operation_id, known, account_id=account_id), sandbox, token)
    assert response.status_code in allowed, (response.status_code, response.text)
    if refusal == "wrong token":
        # Field notes: "a bad token 401 {"error": "Invalid Access Token"}"
        assert response.json() == {"error": "Invalid Access Token"}


def test_other_account_reaches_its_own_inbox(sandbox: SandboxProcess, known: dict[str, Any]) -> None:
    case = _case("listInboxes", known, account_id=2)
    response = _send(case, sandbox, OTHER_TOKEN)
    assert response.status_code == 200, response.text
    assert [inbox["id"] for inbox in response.json()["payload"]] == [OTHER_ACCOUNT_INBOX]


KNOWN_ERRORS = {
    # name: (operation, overrides of the valid request, allowed statuses)
    # Contract 400, field notes 422. Inbox 5 (API channel) needs no phone, so the duplicate is the only fault.
    "duplicate contact identifier": (
        "createContact",
        {"body": {"inbox_id": 5, "identifier": "conformance-probe-1"}},
        {400, 422},
    ),
    "duplicate contact phone": ("createContact", {"body": {"inbox_id": 5, "phone_number": "+15550990001"}}, {400, 422}),
    "unknown contact": ("listContactableInboxes", {"path_parameters": {"contact_id": UNKNOWN_ID}}, {404, 422}),
    "unknown conversation (read)": ("listMessages", {"path_parameters": {"conversation_id": UNKNOWN_ID}}, {404}),
    "unknown conversation (send)": ("createMessage", {"path_parameters": {"conversation_id": UNKNOWN_ID}}, {404}),
    "unknown source_id": ("createConversation", {"body": {"source_id": "no-such-source-id"}}, {400, 404, 422}),
    "template not approved": (
        "createMessage",
        {"body": {"content": "x", "template_params": {**APPROVED_TEMPLATE, "name": "never_approved"}}},
        {200, 400, 422},
    ),
}


@pytest.mark.parametrize("name", sorted(KNOWN_ERRORS))
def test_known_errors_conform(name: str, sandbox: SandboxProcess, known: dict[str, Any]) -> None:
    operation_id, overrides, allowed = KNOWN_ERRORS[name]
    request = _request(operation_id, known)
    if "path_parameters" in overrides:
        request["path_parameters"] = {**request["path_parameters"], **overrides["path_parameters"]}
    if "body" in overrides:
        request["body"] = overrides["body"]
    case = schema.find_operation_by_id(operation_id).Case(**request)
    response = _send(case, sandbox, DEFAULT_TOKEN)
    assert response.status_code in allowed, (response.status_code, response.text)


@pytest.mark.parametrize("operation_id", OPERATION_IDS)
def test_rate_limited_answer_conforms(operation_id: str, sandbox: SandboxProcess, known: dict[str, Any]) -> None:
    # Given the sandbox rate-limits every call of this operation
    sandbox.set_faults({operation_id: {"rate_limit_share": 1.0}})
    try:
        # When the operation is called, then the answer is the field notes' 429
        response = _send(_case(operation_id, known), sandbox, DEFAULT_TOKEN)
    finally:
        sandbox.set_faults({})
    assert response.status_code == 429
    assert response.headers.get("content-type", [""])[0].split(";")[0].strip() == "text/plain"
    assert response.text.strip() == "Retry later"
    assert "retry-after" not in {name.lower() for name in response.headers}


def test_created_message_is_accepted_not_delivered(sandbox: SandboxProcess, known: dict[str, Any]) -> None:
    # A 200 to a send means accepted; the message starts at the configured initial status (sent)
    response = _send(_case("createMessage", known), sandbox, DEFAULT_TOKEN)
    assert response.status_code == 200, response.text
    message = response.json()
    assert message["status"] in ("sent", None)
    assert message["message_type"] in (1, 3)  # outgoing or template, integers in API responses
    listed = _send(_case("listMessages", known), sandbox, DEFAULT_TOKEN).json()
    assert message["id"] in {m["id"] for m in listed["payload"]}
    assert validation_errors({"$ref": "#/components/schemas/Message"}, message) == []


def test_limits_of_the_field_notes_conform(known: dict[str, Any]) -> None:
    """The limits the field notes report, reached for real rather than injected as faults."""
    config = "[behaviour]\ncontact_search_per_minute = 2\nconversation_messages_per_minute = 2\n"
    with running_sandbox(config) as limited:
        # Given a contact and a conversation in the limited sandbox
        with httpx.Client(base_url=limited.api_url, headers=limited.headers, timeout=10, trust_env=False) as client:
            contact = client.post("/contacts", json={"inbox_id": 5, "identifier": "limits-1"}).json()["payload"]
            conversation = client.post("/conversations", json={"source_id": contact["contact_inbox"]["source_id"]})
            assert conversation.status_code == 200, conversation.text
        ids = {**known, "conversation_id": conversation.json()["id"]}
        # When contact search goes past its limit, then 429 text/plain "Retry later"
        searches = [_send(_case("searchContacts", ids), limited, DEFAULT_TOKEN) for _ in range(3)]
        assert [r.status_code for r in searches] == [200, 200, 429]
        assert searches[-1].text.strip() == "Retry later"
        # When a conversation gets more messages a minute than allowed, then 422 "Too many messages"
        sends = [_send(_case("createMessage", ids), limited, DEFAULT_TOKEN) for _ in range(3)]
        assert [r.status_code for r in sends] == [200, 200, 422]
        assert "Too many messages" in sends[-1].text
