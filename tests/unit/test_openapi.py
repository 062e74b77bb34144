"""The OpenAPI description of the messaging contract says what the contract says.

Checks docs/openapi/messaging-api.yaml against shared/contract/messaging-api.md (operations, paths,
parameters, the status table, the security scheme), against shared/field-notes.md (the statuses the
real service adds, marked ``x-source: field-notes``) and against the real request bodies in
tests/fixtures/examples/ (copied from the team's shared examples; their source is in its README).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from tests.support.fixtures import EXAMPLES
from tests.support.openapi import (
    load_spec,
    operations_by_id,
    request_schema,
    resolve,
    response_schema,
    validation_errors,
)

EXAMPLES_DIR = EXAMPLES

BASE = "/api/v1/accounts/{account_id}"

# Contract, "Endpoints": operation -> (method, path below the base path).
CONTRACT_ENDPOINTS = {
    "listInboxes": ("get", "/inboxes"),
    "searchContacts": ("get", "/contacts/search"),
    "createContact": ("post", "/contacts"),
    "listContactableInboxes": ("get", "/contacts/{contact_id}/contactable_inboxes"),
    "listConversations": ("get", "/conversations"),
    "createConversation": ("post", "/conversations"),
    "listMessages": ("get", "/conversations/{conversation_id}/messages"),
    "createMessage": ("post", "/conversations/{conversation_id}/messages"),
    "listWebhooks": ("get", "/webhooks"),
    "createWebhook": ("post", "/webhooks"),
}

# Contract, "Errors": statuses other than 200 per operation.
CONTRACT_STATUSES = {
    "listInboxes": {"401", "403"},
    "searchContacts": {"401"},
    "createContact": {"400", "401"},
    "listContactableInboxes": {"401", "422"},
    "listConversations": {"401"},
    "createConversation": {"400", "403"},
    "listMessages": {"401", "404"},
    "createMessage": {"403", "404"},
    "listWebhooks": {"401"},
    "createWebhook": {"401"},
}

WRITE_OPERATIONS = {"createContact", "createConversation", "createMessage", "createWebhook"}
WEBHOOK_EVENTS = {
    "conversation_created",
    "conversation_status_changed",
    "conversation_updated",
    "message_created",
    "message_updated",
    "contact_created",
    "contact_updated",
}

# Every file in shared/examples/ is classified here: the operation whose request body it is, or None
# when it is outside the ten operations. An unclassified file fails test_every_example_is_classified.
EXAMPLE_OPERATIONS: dict[str, str | None] = {
    "swagger_message_create_whatsapp_template_image_header.request.json": "createMessage",
    "swagger_message_create_whatsapp_template_copy_code_button.request.json": "createMessage",
    "docs_conversation_create_email_inbox.request.json": "createConversation",
    "issue6704_conversation_create_with_whatsapp_template_legacy_params.request.json": "createConversation",
    "swagger_contacts_filter.request.json": None,  # contact filter: outside the contract
    "swagger_inbox_create_api_channel.request.json": None,  # inbox creation: outside the contract
    "swagger_inbox_create_whatsapp_cloud.request.json": None,  # inbox creation: outside the contract
}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return load_spec()


@pytest.fixture(scope="module")
def operations(spec: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    return operations_by_id(spec)


def _responses(spec: dict[str, Any], operation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {status: resolve(spec, response) for status, response in operation["responses"].items()}


def _parameters(spec: dict[str, Any], path: str, operation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    shared = spec["paths"][path].get("parameters", [])
    own = operation.get("parameters", [])
    return {p["name"]: p for p in (resolve(spec, item) for item in [*shared, *own])}


def _examples_dir() -> Path:
    if not EXAMPLES_DIR.is_dir():
        pytest.fail(f"request examples not found at {EXAMPLES_DIR}")
    return EXAMPLES_DIR


# --- the document -----------------------------------------------------------------------------


def test_file_is_valid_openapi_3_1(spec: dict[str, Any]) -> None:
    assert spec["openapi"] == "3.1.0"
    validate(spec, cls=OpenAPIV31SpecValidator)


BREAKAGES = {
    "path parameter not declared": lambda doc: doc["paths"][BASE + "/inboxes"].pop("parameters"),
    "parameter in body (OpenAPI 2 style)": lambda doc: doc["components"]["parameters"]["AccountId"].update(
        {"in": "body"}
    ),
    "duplicate operationId": lambda doc: doc["paths"][BASE + "/webhooks"]["get"].update(
        {"operationId": "listInboxes"}
    ),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_validator_rejects_a_broken_copy(breakage: str, spec: dict[str, Any]) -> None:
    # Given a copy of the description with one mistake
    broken = json.loads(json.dumps(spec))
    BREAKAGES[breakage](broken)
    # Then the same validator call refuses it, so the validity test above can fail
    with pytest.raises(OpenAPIValidationError):
        validate(broken, cls=OpenAPIV31SpecValidator)


def test_info_version_is_the_contract_version(spec: dict[str, Any]) -> None:
    assert spec["info"]["version"] == "1.0.0"


def test_server_is_a_variable_base_url(spec: dict[str, Any]) -> None:
    (server,) = spec["servers"]
    assert server["url"] == "{base_url}"
    assert server["variables"]["base_url"]["default"].startswith("http")


def test_operation_ids_are_exactly_the_contracts_ten(spec: dict[str, Any]) -> None:
    ids = [op["operationId"] for path in spec["paths"].values() for key, op in path.items() if key != "parameters"]
    assert sorted(ids) == sorted(CONTRACT_ENDPOINTS)


@pytest.mark.parametrize("operation_id", sorted(CONTRACT_ENDPOINTS))
def test_operation_has_the_contracts_method_and_path(operation_id: str, operations: dict) -> None:
    path, method, _ = operations[operation_id]
    assert (method, path) == (CONTRACT_ENDPOINTS[operation_id][0], BASE + CONTRACT_ENDPOINTS[operation_id][1])


def test_security_scheme_is_the_api_access_token_header(spec: dict[str, Any]) -> None:
    scheme = spec["components"]["securitySchemes"]["api_access_token"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", "api_access_token")
    assert spec["security"] == [{"api_access_token": []}]
    for _, _, operation in operations_by_id(spec).values():
        assert operation.get("security", spec["security"]) == [{"api_access_token": []}]


# --- parameters -------------------------------------------------------------------------------


@pytest.mark.parametrize("operation_id", sorted(CONTRACT_ENDPOINTS))
def test_path_parameters_are_required_integers(operation_id: str, spec: dict, operations: dict) -> None:
    path, _, operation = operations[operation_id]
    params = _parameters(spec, path, operation)
    in_path = {name for name, p in params.items() if p["in"] == "path"}
    assert in_path == {part[1:-1] for part in path.split("/") if part.startswith("{")}
    for name in in_path:
        assert params[name]["required"] is True
        assert params[name]["schema"]["type"] == "integer", name


def test_search_contacts_query(spec: dict, operations: dict) -> None:
    path, _, operation = operations["searchContacts"]
    params = _parameters(spec, path, operation)
    assert params["q"]["in"] == "query"
    assert params["q"]["required"] is True
    assert params["q"]["schema"]["type"] == "string"
    assert params["page"]["schema"] == {"type": "integer", "minimum": 1, "default": 1}


def test_list_conversations_query(spec: dict, operations: dict) -> None:
    path, _, operation = operations["listConversations"]
    params = _parameters(spec, path, operation)
    assert params["inbox_id"]["schema"]["type"] == "integer"
    assert params["status"]["schema"]["enum"] == ["all", "open", "resolved", "pending", "snoozed"]
    assert params["status"]["schema"]["default"] == "open"
    assert params["page"]["schema"]["minimum"] == 1
    assert not any(p.get("required") for p in params.values() if p["in"] == "query")


def test_list_messages_pages_by_message_id(spec: dict, operations: dict) -> None:
    path, _, operation = operations["listMessages"]
    params = _parameters(spec, path, operation)
    for name in ("before", "after"):
        assert params[name]["in"] == "query"
        assert params[name]["schema"]["type"] == "integer"
        assert params[name]["x-source"] == "field-notes"


# --- statuses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("operation_id", sorted(CONTRACT_STATUSES))
def test_operation_lists_the_contracts_statuses(operation_id: str, spec: dict, operations: dict) -> None:
    _, _, operation = operations[operation_id]
    responses = _responses(spec, operation)
    expected = CONTRACT_STATUSES[operation_id] | {"200"}
    assert expected <= set(responses)
    for status in expected:
        assert responses[status]["x-source"] == "contract", (operation_id, status)


@pytest.mark.parametrize("operation_id", sorted(CONTRACT_STATUSES))
def test_statuses_outside_the_table_come_from_the_field_notes(operation_id: str, spec: dict, operations: dict) -> None:
    _, _, operation = operations[operation_id]
    for status, response in _responses(spec, operation).items():
        if status not in CONTRACT_STATUSES[operation_id] | {"200"}:
            assert response["x-source"] == "field-notes", (operation_id, status)
        assert response["description"].strip(), (operation_id, status)


@pytest.mark.parametrize("operation_id", sorted(CONTRACT_STATUSES))
def test_field_note_statuses_on_every_operation(operation_id: str, spec: dict, operations: dict) -> None:
    _, _, operation = operations[operation_id]
    responses = _responses(spec, operation)
    # 401 everywhere; 403 and 404 on every account-scoped path (all of them); 429 everywhere
    assert {"401", "403", "404", "429"} <= set(responses)
    if operation_id in WRITE_OPERATIONS:
        assert {"400", "422"} <= set(responses)
    assert set(responses["429"]["content"]) == {"text/plain"}
    assert responses["429"]["content"]["text/plain"]["schema"] == {"type": "string"}
    assert "Retry-After" not in responses["429"].get("headers", {})


def test_duplicate_contact_and_too_many_messages_are_422(operations: dict) -> None:
    assert "already exists" in operations["createContact"][2]["responses"]["422"]["description"]
    assert "Too many messages" in operations["createMessage"][2]["responses"]["422"]["description"]


@pytest.mark.parametrize("operation_id", sorted(CONTRACT_STATUSES))
def test_error_bodies_are_json_objects(operation_id: str, spec: dict, operations: dict) -> None:
    _, _, operation = operations[operation_id]
    for status, response in _responses(spec, operation).items():
        if status.startswith("4") and status != "429":
            assert set(response["content"]) == {"application/json"}, (operation_id, status)
            schema = resolve(spec, response["content"]["application/json"]["schema"])
            assert schema["type"] == "object"
            assert validation_errors(response["content"]["application/json"]["schema"], {"error": "x"}) == []
            assert validation_errors(response["content"]["application/json"]["schema"], {"message": "x"}) == []
            assert validation_errors(response["content"]["application/json"]["schema"], ["x"]) != []


# --- request bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize("operation_id", sorted(CONTRACT_ENDPOINTS))
def test_write_operations_and_only_they_have_a_request_body(operation_id: str, spec: dict, operations: dict) -> None:
    _, method, operation = operations[operation_id]
    if operation_id in WRITE_OPERATIONS:
        assert method == "post"
        body = resolve(spec, operation["requestBody"])
        assert body["required"] is True
        assert resolve(spec, body["content"]["application/json"]["schema"])["type"] == "object"
    else:
        assert "requestBody" not in operation


def test_every_example_is_classified() -> None:
    found = {path.name for path in _examples_dir().glob("*.json")}
    assert found, f"no JSON examples in {EXAMPLES_DIR}"
    assert found == set(EXAMPLE_OPERATIONS), "classify new or removed files in EXAMPLE_OPERATIONS"


@pytest.mark.parametrize(
    "name", sorted(name for name, operation_id in EXAMPLE_OPERATIONS.items() if operation_id is not None)
)
def test_shared_example_is_a_valid_request_body(name: str) -> None:
    body = json.loads((_examples_dir() / name).read_text(encoding="utf-8"))
    errors = validation_errors(request_schema(EXAMPLE_OPERATIONS[name]), body)
    assert errors == []


GOOD_TEMPLATE = {
    "name": "appointment_reminder",
    "category": "UTILITY",
    "language": "en",
    "processed_params": {"body": {"1": "Anna", "2": "10:30"}},
}

EVENTS = sorted(WEBHOOK_EVENTS)
GOOD_BODIES = [
    ("createContact", {"inbox_id": 1, "name": "Anna", "phone_number": "+4915112345678", "identifier": "patient-7"}),
    ("createContact", {"inbox_id": 1, "email": "anna@example.com", "additional_attributes": {"k": 1}}),
    ("createConversation", {"source_id": "4915112345678", "inbox_id": 1, "contact_id": 2, "status": "pending"}),
    ("createMessage", {"content": "Your appointment is tomorrow."}),
    ("createMessage", {"content": "x", "message_type": "outgoing", "private": False, "template_params": GOOD_TEMPLATE}),
    ("createWebhook", {"webhook": {"url": "https://hooks.example.com/w", "subscriptions": ["message_updated"]}}),
    ("createWebhook", {"webhook": {"name": "d", "url": "https://h.example/w", "inbox_id": 3, "subscriptions": EVENTS}}),
]


@pytest.mark.parametrize(("operation_id", "body"), GOOD_BODIES)
def test_contract_shaped_bodies_validate(operation_id: str, body: dict) -> None:
    assert validation_errors(request_schema(operation_id), body) == []


def _without(mapping: dict, key: str) -> dict:
    return {k: v for k, v in mapping.items() if k != key}


HOOK = "https://h.example/w"
BAD_BODIES = {
    "template_params without language": ("createMessage", {"template_params": _without(GOOD_TEMPLATE, "language")}),
    "template_params without name": ("createMessage", {"template_params": _without(GOOD_TEMPLATE, "name")}),
    "template_params without processed_params": (
        "createMessage",
        {"template_params": _without(GOOD_TEMPLATE, "processed_params")},
    ),
    "template_params without category": ("createMessage", {"template_params": _without(GOOD_TEMPLATE, "category")}),
    "category outside the enum": (
        "createMessage",
        {"template_params": {**GOOD_TEMPLATE, "category": "SHIPPING_UPDATE"}},
    ),
    "processed_params not an object": ("createMessage", {"template_params": {**GOOD_TEMPLATE, "processed_params": []}}),
    "message without content": ("createMessage", {"content": None}),
    "message_type as in responses": ("createMessage", {"message_type": 1}),
    "message_type activity": ("createMessage", {"message_type": "activity"}),
    "webhook with empty subscriptions": ("createWebhook", {"webhook": {"url": HOOK, "subscriptions": []}}),
    "webhook with an unknown event": (
        "createWebhook",
        {"webhook": {"url": HOOK, "subscriptions": ["message_deleted"]}},
    ),
    "webhook without url": ("createWebhook", {"webhook": {"subscriptions": ["message_updated"]}}),
    "webhook url not a URI": ("createWebhook", {"webhook": {"url": "not a url", "subscriptions": ["message_updated"]}}),
    "webhook fields at the top level": ("createWebhook", {"url": HOOK, "subscriptions": ["message_updated"]}),
    "contact without inbox_id": ("createContact", {"name": "Anna"}),
    "contact inbox_id as a string": ("createContact", {"inbox_id": "1"}),
    "contact email not an email": ("createContact", {"inbox_id": 1, "email": "anna.example.com"}),
    "conversation without source_id": ("createConversation", {"inbox_id": 1, "contact_id": 2}),
    "conversation status snoozed on creation": ("createConversation", {"source_id": "s", "status": "snoozed"}),
}


def _bad_body(operation_id: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A message body is a valid one with ``fields`` changed (None removes a key); others are as given."""
    if operation_id != "createMessage":
        return fields
    body = {"content": "x", **fields}
    return {k: v for k, v in body.items() if v is not None}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_bodies_are_refused(case: str) -> None:
    operation_id, fields = BAD_BODIES[case]
    assert validation_errors(request_schema(operation_id), _bad_body(operation_id, fields)) != [], case


# --- response bodies: tolerant, but shaped as the field notes say --------------------------------

INBOX = {"id": 1, "name": "WhatsApp", "channel_type": "Channel::Whatsapp", "phone_number": "+15551234567"}
MESSAGE = {
    "id": 9,
    "content": "hi",
    "account_id": 1,
    "inbox_id": 1,
    "conversation_id": 4,
    "message_type": 1,
    "created_at": 1732280000,
    "status": "sent",
    "source_id": None,
    "content_attributes": {},
    "private": False,
}

WEBHOOK = {"id": 1, "url": "https://h.example/w", "subscriptions": ["message_updated"]}

GOOD_RESPONSES = [
    ("listInboxes", {"payload": [INBOX]}),
    ("searchContacts", {"meta": {"count": 1, "current_page": 1, "has_more": False}, "payload": [{"id": 2}]}),
    ("searchContacts", {"meta": {"count": 0, "current_page": "1"}, "payload": []}),
    ("createContact", {"payload": {"contact": {"id": 2}, "contact_inbox": {"source_id": "abc", "inbox": INBOX}}}),
    ("listContactableInboxes", {"payload": [{"source_id": "15551234567", "inbox": INBOX}]}),
    ("listConversations", {"data": {"meta": {"all_count": 1}, "payload": [{"id": 4, "account_id": 1, "inbox_id": 1}]}}),
    ("createConversation", {"id": 4, "account_id": 1, "inbox_id": 1, "status": "open", "messages": []}),
    ("listMessages", {"meta": {}, "payload": [MESSAGE, {**MESSAGE, "status": None, "content": None}]}),
    ("createMessage", MESSAGE),
    ("createMessage", {**MESSAGE, "status": "failed", "external_error": "131047: Re-engagement message"}),
    ("createMessage", {**MESSAGE, "status": "failed", "content_attributes": {"external_error": "131026"}}),
    ("listWebhooks", {"payload": {"webhooks": [WEBHOOK]}}),
    ("createWebhook", {"payload": {"webhook": {**WEBHOOK, "name": None, "account_id": 1, "secret": "s3cr3t"}}}),
]


@pytest.mark.parametrize(("operation_id", "body"), GOOD_RESPONSES)
def test_field_note_shaped_responses_validate(operation_id: str, body: Any) -> None:
    assert validation_errors(response_schema(operation_id, "200"), body) == []


BAD_RESPONSES = [
    ("listInboxes", {"inboxes": [INBOX]}),
    ("listInboxes", {"payload": [{"id": "1", "name": "x", "channel_type": "Channel::Api"}]}),
    ("searchContacts", {"meta": {"count": 1, "current_page": None}, "payload": []}),
    ("createContact", {"payload": {"contact": {"id": 2}, "contact_inbox": {"inbox": INBOX}}}),
    ("listContactableInboxes", {"payload": [{"inbox": INBOX}]}),
    ("listConversations", {"payload": [{"id": 4, "account_id": 1, "inbox_id": 1}]}),
    ("createConversation", {"id": 4, "inbox_id": 1}),
    ("listMessages", {"payload": [MESSAGE]}),
    ("createMessage", {**MESSAGE, "status": "progress"}),
    ("createMessage", {**MESSAGE, "message_type": "outgoing"}),
    ("createMessage", {**MESSAGE, "created_at": "2024-11-22T12:00:00Z"}),
    ("listWebhooks", {"payload": [{"id": 1}]}),
    ("createWebhook", {"payload": {"webhook": WEBHOOK}}),  # no secret
]


@pytest.mark.parametrize(("operation_id", "body"), BAD_RESPONSES)
def test_misshaped_responses_are_refused(operation_id: str, body: Any) -> None:
    assert validation_errors(response_schema(operation_id, "200"), body) != []
