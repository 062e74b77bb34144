"""WorkspaceClient sends exactly what the contract says, and nothing that must stay secret."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from dispatcher.api import WorkspaceClient, quiet_http_logging
from dispatcher.api import shared as shared_module
from dispatcher.api.records import MessageType
from dispatcher.api.shared import close_shared_clients, shared_client

from .conftest import ACCOUNT_ID, BASE_URL, EXAMPLES, PREFIX, SECRET_TOKEN, reply

MESSAGE = {"id": 900, "content": "x", "message_type": 1, "status": None, "conversation_id": 42}

# operation: (call, answer body, method, path, query, JSON body or None)
OPERATIONS: dict[str, tuple[Any, Any, str, str, dict[str, str], Any]] = {
    "listInboxes": (lambda c: c.list_inboxes(), {"payload": [{"id": 3}]},
                    "GET", "/inboxes", {}, None),
    "searchContacts": (lambda c: c.search_contacts("patient-77", page=2), {"payload": []},
                       "GET", "/contacts/search", {"q": "patient-77", "page": "2"}, None),
    "createContact": (lambda c: c.create_contact(inbox_id=3, name="Ann", phone_number="+15551234567",
                                                 email="ann@example.org", identifier="patient-77",
                                                 additional_attributes={"city": "X"}),
                      {"payload": {"contact": {"id": 11}, "contact_inbox": {"source_id": "s"}}},
                      "POST", "/contacts", {},
                      {"inbox_id": 3, "name": "Ann", "phone_number": "+15551234567",
                       "email": "ann@example.org", "identifier": "patient-77",
                       "additional_attributes": {"city": "X"}}),
    "listContactableInboxes": (lambda c: c.list_contactable_inboxes(11), {"payload": []},
                               "GET", "/contacts/11/contactable_inboxes", {}, None),
    "listConversations": (lambda c: c.list_conversations(inbox_id=3, status="all", page=4),
                          {"data": {"meta": {}, "payload": []}},
                          "GET", "/conversations", {"inbox_id": "3", "status": "all", "page": "4"}, None),
    "createConversation": (lambda c: c.create_conversation(source_id="src-1", inbox_id=3, contact_id=11,
                                                           status="open", custom_attributes={"k": 1}),
                           {"id": 42}, "POST", "/conversations", {},
                           {"source_id": "src-1", "inbox_id": 3, "contact_id": 11, "status": "open",
                            "custom_attributes": {"k": 1}}),
    "listMessages": (lambda c: c.list_messages(42, before=900), {"payload": []},
                     "GET", "/conversations/42/messages", {"before": "900"}, None),
    "createMessage": (lambda c: c.create_message(42, content="See you at 9"), MESSAGE,
                      "POST", "/conversations/42/messages", {},
                      {"content": "See you at 9", "message_type": "outgoing", "private": False}),
    "listWebhooks": (lambda c: c.list_webhooks(), {"payload": {"webhooks": []}},
                     "GET", "/webhooks", {}, None),
    "createWebhook": (lambda c: c.create_webhook(url="https://hooks.example/in", name="d",
                                                 subscriptions=["message_created", "message_updated"]),
                      {"payload": {"webhook": {"id": 5, "secret": "s"}}}, "POST", "/webhooks", {},
                      {"webhook": {"url": "https://hooks.example/in", "name": "d",
                                   "subscriptions": ["message_created", "message_updated"]}}),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_each_operation_sends_method_path_query_body_and_token(make_client, operation: str) -> None:
    call, answer, method, path, query, body = OPERATIONS[operation]
    client, recorder = make_client(reply(200, answer))
    call(client)
    request = recorder.last
    assert len(recorder.requests) == 1
    assert request.method == method
    assert request.url.scheme == "https" and request.url.host == "workspace.example"
    assert request.url.path == PREFIX + path
    assert dict(request.url.params) == query
    assert request.headers["api_access_token"] == SECRET_TOKEN
    assert SECRET_TOKEN not in str(request.url)
    if body is None:
        assert request.content == b""
    else:
        assert request.headers["content-type"] == "application/json"
        assert json.loads(request.content) == body


def test_optional_arguments_are_left_out(make_client) -> None:
    client, recorder = make_client(reply(200, {"id": 42}))
    client.create_conversation(source_id="src-1")
    assert recorder.last_json() == {"source_id": "src-1"}
    client, recorder = make_client(reply(200, {"payload": {"contact": {"id": 1}}}))
    client.create_contact(inbox_id=3)
    assert recorder.last_json() == {"inbox_id": 3}
    client, recorder = make_client(reply(200, {"payload": []}))
    client.list_messages(42)
    assert recorder.last.url.query == b""
    client, recorder = make_client(reply(200, {"payload": []}))
    client.list_conversations()
    assert dict(recorder.last.url.params) == {"status": "open", "page": "1"}


def test_plus_in_a_phone_query_is_percent_encoded(make_client) -> None:
    client, recorder = make_client(reply(200, {"payload": []}))
    client.search_contacts("+15551234567")
    raw = recorder.last.url.raw_path
    assert b"q=%2B15551234567" in raw and b"+" not in raw
    assert recorder.last.url.params["q"] == "+15551234567"


def test_template_params_pass_through_unchanged_and_no_source_id(make_client) -> None:
    example = json.loads((EXAMPLES / "swagger_message_create_whatsapp_template_image_header.request.json").read_text())
    client, recorder = make_client(reply(200, {"payload": MESSAGE}))
    message = client.create_message(42, content=example["content"], template_params=example["template_params"])
    sent = recorder.last_json()
    assert sent["template_params"] == example["template_params"]
    assert sent["content"] == example["content"]
    assert sent["message_type"] == "outgoing" and "source_id" not in sent
    assert message.id == 900 and message.message_type is MessageType.OUTGOING


def test_create_message_bodies_never_carry_source_id(make_client) -> None:
    client, recorder = make_client(reply(200, MESSAGE))
    client.create_message(1, content="a")
    client.create_message(1, content="b", private=True)
    assert all("source_id" not in json.loads(r.content) for r in recorder.requests)
    assert json.loads(recorder.last.content)["private"] is True


def test_create_message_with_incomplete_template_is_refused_before_sending(make_client) -> None:
    client, recorder = make_client(reply(200, MESSAGE))
    with pytest.raises(ValueError, match="processed_params"):
        client.create_message(1, content="a", template_params={"name": "t", "category": "UTILITY",
                                                               "language": "en"})
    assert recorder.requests == []


@pytest.mark.parametrize(("call", "match"), [
    (lambda c: c.search_contacts(""), "q"),
    (lambda c: c.search_contacts("x", page=0), "page"),
    (lambda c: c.list_conversations(status="closed"), "status"),
    (lambda c: c.create_conversation(source_id="s", status="snoozed"), "status"),
    (lambda c: c.create_conversation(source_id=""), "source_id"),
    (lambda c: c.create_webhook(url="https://h.example", subscriptions=[]), "subscriptions"),
    (lambda c: c.create_webhook(url="https://h.example", subscriptions=["message_deleted"]), "subscriptions"),
    (lambda c: c.list_messages(0), "conversation_id"),
    (lambda c: c.list_contactable_inboxes(True), "contact_id"),
    (lambda c: c.list_messages(1, before=-5), "before"),
    (lambda c: c.create_conversation(source_id="s", contact_id=0), "contact_id"),
    (lambda c: c.create_webhook(url="https://h.example", subscriptions=["message_updated"], inbox_id="3"), "inbox_id"),
])
def test_arguments_outside_the_contract_are_refused(make_client, call, match: str) -> None:
    client, recorder = make_client(reply(200, {}))
    with pytest.raises(ValueError, match=match):
        call(client)
    assert recorder.requests == []


def test_token_absent_from_repr_str_and_auth(make_client) -> None:
    client, _ = make_client(reply(200, {}))
    texts = [repr(client), str(client), repr(client._http.auth), repr(client._http.headers), repr(vars(client))]
    assert all(SECRET_TOKEN not in text for text in texts)
    assert repr(client) == f"WorkspaceClient(base_url='{BASE_URL}', account_id={ACCOUNT_ID})"


@pytest.mark.parametrize(("base_url", "expected"), [
    ("https://workspace.example", "https://workspace.example"),
    ("https://workspace.example/", "https://workspace.example"),
    ("https://workspace.example/chat/", "https://workspace.example/chat"),
    ("http://127.0.0.1:8025", "http://127.0.0.1:8025"),
])
def test_base_url_accepted(base_url: str, expected: str) -> None:
    recorded: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda r: recorded.append(r) or httpx.Response(200, json={"payload": []}))
    with WorkspaceClient(base_url=base_url, account_id=2, api_token="t", transport=transport) as client:
        client.list_inboxes()
    assert client.base_url == expected
    assert str(recorded[0].url) == f"{expected}/api/v1/accounts/2/inboxes"


@pytest.mark.parametrize("base_url", [
    "https://workspace.example/api/v1", "https://workspace.example/api/v1/",
    "https://workspace.example/api/v1/accounts/2", "workspace.example", "ftp://workspace.example",
    "https://user:pw@workspace.example", "https://workspace.example/?x=1",
])
def test_base_url_refused(base_url: str) -> None:
    with pytest.raises(ValueError, match="base_url"):
        WorkspaceClient(base_url=base_url, account_id=2, api_token="t")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"account_id": 0}, "account_id"), ({"account_id": True}, "account_id"),
    ({"api_token": ""}, "api_token"), ({"api_token": " padded "}, "api_token"),
    ({"api_token": "t\u00f6ken"}, "api_token"), ({"max_connections": 0}, "max_connections"),
])
def test_constructor_refuses_bad_values_without_echoing_them(kwargs: dict[str, Any], match: str) -> None:
    arguments: dict[str, Any] = {"base_url": BASE_URL, "account_id": 2, "api_token": "t", **kwargs}
    with pytest.raises(ValueError, match=match) as info:
        WorkspaceClient(**arguments)
    assert "padded" not in str(info.value) and "t\u00f6ken" not in str(info.value)


def _settings(**overrides: Any) -> SimpleNamespace:
    values: dict[str, Any] = dict(
        api_url=BASE_URL, account_id=ACCOUNT_ID, api_token=SecretStr(SECRET_TOKEN),
        http_connect_timeout_s=1.5, http_read_timeout_s=12.0, http_write_timeout_s=8.0,
        http_pool_timeout_s=2.0, http_max_connections=4)
    return SimpleNamespace(**{**values, **overrides})


def test_from_settings_applies_url_token_and_timeouts_in_seconds() -> None:
    recorded: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda r: recorded.append(r) or httpx.Response(200, json={"payload": []}))
    with WorkspaceClient.from_settings(_settings(), transport=transport) as client:
        client.list_webhooks()
    request = recorded[0]
    assert request.extensions["timeout"] == {"connect": 1.5, "read": 12.0, "write": 8.0, "pool": 2.0}
    assert request.headers["api_access_token"] == SECRET_TOKEN
    assert str(request.url) == f"{BASE_URL}{PREFIX}/webhooks"


def test_default_timeouts_are_bounded(make_client) -> None:
    client, recorder = make_client(reply(200, {"payload": []}))
    client.list_inboxes()
    timeouts = recorder.last.extensions["timeout"]
    assert all(isinstance(v, float) and 0 < v <= 60 for v in timeouts.values())


def test_shared_client_one_per_settings_and_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    close_shared_clients()
    try:
        first = shared_client(_settings())
        assert shared_client(_settings()) is first
        assert shared_client(_settings(api_token=SecretStr("rotated"))) is not first
        assert shared_client(_settings(http_read_timeout_s=30.0)) is not first
        monkeypatch.setattr(shared_module.os, "getpid", lambda: 999_999_999)  # as if forked
        child = shared_client(_settings())
        assert child is not first
        assert shared_client(_settings()) is child
    finally:
        monkeypatch.undo()
        close_shared_clients()
    assert shared_module._clients == {}


def test_close_and_context_manager(make_client) -> None:
    client, _ = make_client(reply(200, {"payload": []}))
    with client as entered:
        assert entered is client
    with pytest.raises(RuntimeError):  # httpx refuses to send on a closed client
        client.list_inboxes()
    client.close()  # idempotent


def test_http_loggers_are_held_at_warning() -> None:
    logging.getLogger("httpx").setLevel(logging.INFO)
    logging.getLogger("httpcore").setLevel(logging.NOTSET)
    WorkspaceClient(base_url=BASE_URL, account_id=1, api_token="t").close()
    assert logging.getLogger("httpx").level == logging.WARNING
    assert logging.getLogger("httpcore").level == logging.WARNING
    logging.getLogger("httpx").setLevel(logging.ERROR)
    quiet_http_logging()
    assert logging.getLogger("httpx").level == logging.ERROR  # stricter is left alone
    logging.getLogger("httpx").setLevel(logging.WARNING)


def test_client_logs_operation_and_status_only(make_client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client, _ = make_client(reply(200, {"payload": []}))
    client.search_contacts("+15551234567")
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("searchContacts -> HTTP 200") for line in lines)
    assert not any("1555" in line or "workspace.example" in line for line in lines)
