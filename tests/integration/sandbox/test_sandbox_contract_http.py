"""The ten contract operations over real HTTP: auth, shapes, paging, semantics and error statuses.

The ``sandbox`` fixture runs the default profile, stock, as users meet it; tests named ``..._contract``
run the contract profile, whose nominal shapes a client must tolerate too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sandbox_helpers import Api

from tests.support.fixtures import EXAMPLES
from tests.support.sandbox_process import OTHER_TOKEN, REPO_ROOT, SandboxProcess, running_sandbox

pytestmark = pytest.mark.integration


def example(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


# -- authentication and account scope ----------------------------------------------------------
def test_missing_token_is_401_with_the_stock_sign_in_body(sandbox: SandboxProcess) -> None:
    response = httpx.get(f"{sandbox.api_url}/inboxes", trust_env=False)
    assert response.status_code == 401
    assert response.json() == {"errors": ["You need to sign in or sign up before continuing."]}


def test_unknown_token_is_401_invalid_access_token(sandbox: SandboxProcess) -> None:
    response = httpx.get(f"{sandbox.api_url}/inboxes", headers={"api_access_token": "nope"}, trust_env=False)
    assert response.status_code == 401
    assert response.json() == {"error": "Invalid Access Token"}


def test_token_of_another_account_is_401_not_authorized_on_stock(sandbox: SandboxProcess) -> None:
    response = httpx.get(f"{sandbox.api_url}/inboxes", headers={"api_access_token": OTHER_TOKEN}, trust_env=False)
    assert response.status_code == 401
    assert response.json() == {"error": "You are not authorized to access this account"}


@pytest.mark.parametrize("headers", [{}, {"api_access_token": "nope"}])
def test_missing_or_unknown_token_is_401_invalid_access_token_contract(
    contract_sandbox: SandboxProcess, headers: dict
) -> None:
    response = httpx.get(f"{contract_sandbox.api_url}/inboxes", headers=headers, trust_env=False)
    assert response.status_code == 401
    assert response.json() == {"error": "Invalid Access Token"}


def test_token_of_another_account_is_403_contract(contract_sandbox: SandboxProcess) -> None:
    headers = {"api_access_token": OTHER_TOKEN}
    response = httpx.get(f"{contract_sandbox.api_url}/inboxes", headers=headers, trust_env=False)
    assert response.status_code == 403
    assert response.json() == {"error": "You are not authorized to access this account"}


def test_unknown_account_is_404_json(sandbox: SandboxProcess) -> None:
    response = httpx.get(f"{sandbox.base_url}/api/v1/accounts/99/inboxes", headers=sandbox.headers, trust_env=False)
    assert response.status_code == 404
    assert "error" in response.json()


def test_unknown_path_answers_json_404(sandbox: SandboxProcess) -> None:
    response = httpx.get(f"{sandbox.base_url}/api/v1/nothing", trust_env=False)
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")


# -- inboxes and contacts ------------------------------------------------------------------------
def test_list_inboxes_is_wrapped_in_payload_with_every_channel_kind(api: Api) -> None:
    body = api.get("/inboxes").json()
    kinds = {i["id"]: i["channel_type"] for i in body["payload"]}
    assert kinds == {
        1: "Channel::Whatsapp",
        2: "Channel::Sms",
        3: "Channel::Email",
        4: "Channel::WebSession",
        5: "Channel::Api",
    }


def test_create_contact_returns_contact_and_contact_inbox_with_source_id(api: Api) -> None:
    response = api.post("/contacts", {"inbox_id": 1, "name": "Ana", "phone_number": "+15551234567", "identifier": "p-1"})
    assert response.status_code == 200
    payload = response.json()["payload"]
    assert payload["contact"]["identifier"] == "p-1"
    assert payload["contact_inbox"]["source_id"] == "15551234567"
    assert payload["contact_inbox"]["inbox"]["id"] == 1


@pytest.mark.parametrize(
    "clash",
    [{"identifier": "p-1"}, {"phone_number": "+15550001111"}, {"email": "ANA@example.com"}],
)
def test_duplicate_identifier_phone_or_email_is_422_with_the_stock_validation_body(api: Api, clash: dict) -> None:
    api.contact(5, identifier="p-1", phone_number="+15550001111", email="ana@example.com")
    response = api.post("/contacts", {"inbox_id": 5, **clash})
    assert response.status_code == 422
    body = response.json()
    assert set(body) == {"message", "attributes"}  # no "error" key
    assert body["attributes"] == [next(iter(clash))]
    assert body["message"].endswith("has already been taken")


def test_duplicate_contact_is_400_contract(contract_api: Api) -> None:
    contract_api.contact(5, identifier="p-1")
    response = contract_api.post("/contacts", {"inbox_id": 5, "identifier": "p-1"})
    assert response.status_code == 400
    assert response.json() == {"error": "Identifier has already been taken", "attributes": ["identifier"]}


def test_email_is_stored_and_matched_lowercased(api: Api) -> None:
    created = api.contact(3, name="Mixed", email="Mixed.Case@Example.ORG")["contact"]
    assert created["email"] == "mixed.case@example.org"
    found = api.get("/contacts/search", params={"q": "MIXED.case@example.org"}).json()["payload"]
    assert [c["id"] for c in found] == [created["id"]]
    assert api.post("/contacts", {"inbox_id": 3, "email": "MIXED.CASE@example.org"}).status_code == 422


def test_a_body_without_a_json_content_type_is_not_read(api: Api) -> None:
    # given a valid createContact body sent as something other than application/json (or as nothing)
    raw = json.dumps({"inbox_id": 5, "identifier": "plain-text"}).encode()
    for media_type in ("text/plain", "application/x-www-form-urlencoded", "application/vnd.api+json", None):
        headers = {"Content-Type": media_type} if media_type else {}
        response = api.post("/contacts", content=raw, headers=headers)
        # then its fields are not read: inbox_id is missing, and nothing was created
        assert response.status_code == 422, media_type
        assert {d["field"] for d in response.json()["details"]} == {"inbox_id"}
    assert api.get("/contacts/search", params={"q": "plain-text"}).json()["payload"] == []
    # and the same bytes as application/json (with a charset) create the contact
    typed = api.post("/contacts", content=raw, headers={"Content-Type": "application/json; charset=utf-8"})
    assert typed.status_code == 200


def test_racing_creates_of_one_contact_end_on_one_contact(api: Api) -> None:
    def create(_: int) -> int:
        return api.post("/contacts", {"inbox_id": 5, "identifier": "race-1"}).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(create, range(16)))
    assert statuses.count(200) == 1
    assert statuses.count(422) == 15


def test_invalid_contact_bodies(api: Api) -> None:
    assert api.post("/contacts", content=b"{not json", headers={"Content-Type": "application/json"}).status_code == 400
    assert api.post("/contacts", {"name": "no inbox"}).status_code == 422
    assert api.post("/contacts", {"inbox_id": "1"}).status_code == 422
    assert api.post("/contacts", {"inbox_id": 5, "phone_number": "555-1234"}).status_code == 422
    assert api.post("/contacts", {"inbox_id": 99}).status_code == 404
    missing_phone = api.post("/contacts", {"inbox_id": 1, "name": "No Phone"})
    assert missing_phone.status_code == 422
    assert api.get("/contacts/search", params={"q": "No Phone"}).json()["payload"] == []


def test_search_is_a_substring_match_and_current_page_is_1_without_page(api: Api) -> None:
    api.contact(5, name="Long", phone_number="+15551234")
    api.contact(5, name="Short", phone_number="+15559999")
    body = api.get("/contacts/search", params={"q": "+1555123"}).json()
    assert [c["phone_number"] for c in body["payload"]] == ["+15551234"]
    assert body["meta"] == {"count": 1, "current_page": 1, "has_more": False}  # the integer, on stock
    with_page = api.get("/contacts/search", params={"q": "+1555123", "page": 1}).json()
    assert with_page["meta"]["current_page"] == "1"  # the string, when page is given
    by_email = api.get("/contacts/search", params={"q": "hort"}).json()["payload"]
    assert [c["name"] for c in by_email] == ["Short"]


def test_search_pages_hold_15_contacts(api: Api) -> None:
    for n in range(17):
        api.contact(5, identifier=f"pager-{n:02d}")
    first = api.get("/contacts/search", params={"q": "pager-"}).json()
    second = api.get("/contacts/search", params={"q": "pager-", "page": 2}).json()
    assert (first["meta"]["count"], first["meta"]["has_more"]) == (15, True)
    assert (second["meta"]["count"], second["meta"]["has_more"], second["meta"]["current_page"]) == (2, False, "2")
    assert api.get("/contacts/search", params={"q": "x", "page": 0}).status_code == 400
    assert api.get("/contacts/search").status_code == 400


def test_current_page_is_always_an_integer_contract(contract_api: Api) -> None:
    contract_api.contact(5, identifier="pg-1")
    assert contract_api.get("/contacts/search", params={"q": "pg-"}).json()["meta"]["current_page"] == 1
    assert contract_api.get("/contacts/search", params={"q": "pg-", "page": 1}).json()["meta"]["current_page"] == 1


def test_contactable_inboxes_source_ids_per_channel(api: Api) -> None:
    contact = api.contact(5, phone_number="+15557654321", email="bo@example.com")["contact"]
    path = f"/contacts/{contact['id']}/contactable_inboxes"
    first = {e["inbox"]["id"]: e["source_id"] for e in api.get(path).json()["payload"]}
    second = {e["inbox"]["id"]: e["source_id"] for e in api.get(path).json()["payload"]}
    assert first[1] == second[1] == "15557654321"  # platform: phone without +
    assert first[2] == "+15557654321"  # SMS: the phone
    assert first[3] == "bo@example.com"  # e-mail
    assert first[5] == second[5]  # API inbox with a binding (from createContact): stable


def test_api_inbox_without_binding_gets_a_fresh_random_source_id_every_call(api: Api) -> None:
    contact = api.contact(1, phone_number="+15557654000")["contact"]
    path = f"/contacts/{contact['id']}/contactable_inboxes"
    ids = [{e["inbox"]["id"]: e["source_id"] for e in api.get(path).json()["payload"]}[5] for _ in range(3)]
    assert len(set(ids)) == 3
    # the first one, stored by the client, works for createConversation
    conv = api.post("/conversations", {"source_id": ids[0], "inbox_id": 5, "contact_id": contact["id"]})
    assert conv.status_code == 200
    again = {e["inbox"]["id"]: e["source_id"] for e in api.get(path).json()["payload"]}[5]
    assert again == ids[0]


def test_unknown_contact_is_404(api: Api) -> None:
    response = api.get("/contacts/999/contactable_inboxes")
    assert response.status_code == 404
    assert "error" in response.json()


# -- conversations -------------------------------------------------------------------------------
def test_create_conversation_makes_a_new_thread_every_call(api: Api) -> None:
    created = api.contact(5, identifier="t-1")
    body = {"source_id": created["contact_inbox"]["source_id"], "inbox_id": 5}
    first, second = api.post("/conversations", body).json(), api.post("/conversations", body).json()
    assert first["id"] != second["id"]
    assert (first["account_id"], first["inbox_id"]) == (1, 5)
    assert first["id"] == 1  # display ids count per account


def test_lock_to_single_conversation_returns_the_same_thread() -> None:
    config = """
accounts = [{ id = 1, name = "Solo" }]
tokens = [{ token = "t", accounts = [1] }]
inboxes = [{ id = 7, account_id = 1, name = "Locked", channel_type = "Channel::Api", lock_to_single_conversation = true }]
"""
    with running_sandbox(config) as sb:
        sb.token = "t"
        locked = Api(sb)
        created = locked.contact(7, identifier="x")
        body = {"source_id": created["contact_inbox"]["source_id"], "inbox_id": 7}
        ids = {locked.post("/conversations", body).json()["id"] for _ in range(3)}
        locked.close()
    assert ids == {1}


def test_create_conversation_with_unbound_source_id(api: Api) -> None:
    created = api.contact(1, phone_number="+15553332222")
    assert api.post("/conversations", {"source_id": "not-bound"}).status_code == 404
    wrong_inbox = api.post("/conversations", {"source_id": "15553332222", "inbox_id": 2})
    assert wrong_inbox.status_code == 404
    other = api.contact(5, identifier="other")["contact"]
    stolen = {"source_id": created["contact_inbox"]["source_id"], "inbox_id": 1, "contact_id": other["id"]}
    assert api.post("/conversations", stolen).status_code == 422
    assert api.post("/conversations", {"inbox_id": 1}).status_code == 422
    assert api.post("/conversations", {"source_id": "x", "status": "closed"}).status_code == 422


def test_a_plus_in_a_platform_source_id_is_422_on_stock(api: Api) -> None:
    created = api.contact(1, phone_number="+15553334444")["contact"]
    response = api.post("/conversations", {"source_id": "+15553334444", "inbox_id": 1, "contact_id": created["id"]})
    assert response.status_code == 422
    assert response.json()["attributes"] == ["source_id"]
    assert "error" not in response.json()


def test_a_plus_in_a_platform_source_id_is_404_contract(contract_api: Api) -> None:
    created = contract_api.contact(1, phone_number="+15553334444")["contact"]
    body = {"source_id": "+15553334444", "inbox_id": 1, "contact_id": created["id"]}
    assert contract_api.post("/conversations", body).status_code == 404


def test_shared_examples_create_conversations(api: Api) -> None:
    email_body = example("docs_conversation_create_email_inbox.request.json")
    contact = api.contact(3, email=email_body["source_id"])["contact"]
    email_body.update(inbox_id=3, contact_id=contact["id"])
    response = api.post("/conversations", email_body)
    assert response.status_code == 200, response.text
    assert api.sb.messages(conversation_id=response.json()["id"])[0]["content"].startswith("Hi John")

    legacy = example("issue6704_conversation_create_with_whatsapp_template_legacy_params.request.json")
    wa_contact = api.contact(1, phone_number="+" + legacy["source_id"])["contact"]
    legacy.update(inbox_id=1, contact_id=wa_contact["id"])
    assert api.post("/conversations", legacy).status_code == 200


def test_list_conversations_is_under_data_with_filters_and_pages_of_25(api: Api) -> None:
    created = api.contact(5, identifier="many")
    body = {"source_id": created["contact_inbox"]["source_id"], "inbox_id": 5}
    for _ in range(26):
        api.post("/conversations", body)
    api.post("/conversations", {**body, "status": "pending"})
    page1 = api.get("/conversations", params={"inbox_id": 5}).json()
    page2 = api.get("/conversations", params={"inbox_id": 5, "page": 2}).json()
    assert len(page1["data"]["payload"]) == 25
    assert len(page2["data"]["payload"]) == 1
    assert page1["data"]["meta"]["all_count"] == 26
    pending = api.get("/conversations", params={"status": "pending"}).json()["data"]["payload"]
    assert [c["status"] for c in pending] == ["pending"]
    assert len(api.get("/conversations", params={"status": "all"}).json()["data"]["payload"]) == 25
    assert api.get("/conversations", params={"inbox_id": 1}).json()["data"]["payload"] == []
    assert api.get("/conversations", params={"status": "bogus"}).status_code == 400


# -- messages --------------------------------------------------------------------------------------
def test_create_message_answers_the_bare_message(api: Api) -> None:
    conv = api.conversation(5, identifier="m-1")
    response = api.send(conv["id"], {"content": "Reminder"})
    assert response.status_code == 200
    message = response.json()
    assert message["message_type"] == 1
    assert message["status"] == "sent"
    assert isinstance(message["created_at"], int)
    assert message["conversation_id"] == conv["id"]
    assert message["external_error"] is None
    assert message["content_attributes"] == {}


def test_list_messages_latest_20_and_paging(api: Api) -> None:
    conv = api.conversation(5, identifier="m-2")
    ids = [api.send(conv["id"], {"content": f"n{n}"}).json()["id"] for n in range(45)]
    path = f"/conversations/{conv['id']}/messages"
    latest = api.get(path).json()
    assert [m["id"] for m in latest["payload"]] == ids[-20:]
    assert "meta" in latest
    back = api.get(path, params={"before": ids[-20]}).json()["payload"]
    assert [m["id"] for m in back] == ids[5:25]


def test_list_messages_after_gives_up_to_100_and_after_with_before_a_half_open_range(api: Api) -> None:
    conv = api.conversation(5, identifier="m-after")
    ids = [api.send(conv["id"], {"content": f"n{n}"}).json()["id"] for n in range(130)]
    path = f"/conversations/{conv['id']}/messages"
    forward = api.get(path, params={"after": ids[4]}).json()["payload"]
    assert [m["id"] for m in forward] == ids[5:105]  # after the id, oldest first, 100
    between = api.get(path, params={"after": ids[10], "before": ids[20]}).json()["payload"]
    assert [m["id"] for m in between] == ids[10:20]  # [after, before)


def test_unknown_conversation_is_404_for_both_message_operations(api: Api) -> None:
    assert api.get("/conversations/404/messages").status_code == 404
    response = api.send(404, {"content": "x"})
    assert response.status_code == 404
    assert "error" in response.json()


def test_invalid_message_bodies_are_422(api: Api) -> None:
    conv = api.conversation(5, identifier="m-3")
    assert api.send(conv["id"], {}).status_code == 422
    assert api.send(conv["id"], {"content": "x", "message_type": "activity"}).status_code == 422
    partial = {"content": "x", "template_params": {"name": "appointment_reminder", "language": "en"}}
    assert api.send(conv["id"], partial).status_code == 422
    malformed = api.post(f"/conversations/{conv['id']}/messages", content=b"[1,", headers={"Content-Type": "application/json"})
    assert malformed.status_code == 400


# -- webhooks --------------------------------------------------------------------------------------
def test_create_and_list_webhooks(api: Api) -> None:
    response = api.post("/webhooks", {"webhook": {"url": "http://127.0.0.1:9/h", "subscriptions": ["message_updated"]}})
    assert response.status_code == 200
    hook = response.json()["payload"]["webhook"]
    assert set(hook) >= {"id", "name", "url", "account_id", "subscriptions", "secret"}
    assert len(hook["secret"]) >= 24
    listed = api.get("/webhooks").json()
    assert [h["id"] for h in listed["payload"]["webhooks"]] == [hook["id"]]


@pytest.mark.parametrize(
    "body",
    [
        {"webhook": {"subscriptions": ["message_created"]}},
        {"webhook": {"url": "http://127.0.0.1:9/h", "subscriptions": []}},
        {"webhook": {"url": "http://127.0.0.1:9/h", "subscriptions": ["message_deleted"]}},
        {"webhook": {"url": "not a url", "subscriptions": ["message_created"]}},
        {"url": "not a url", "subscriptions": ["message_created"]},
    ],
)
def test_invalid_webhook_bodies_are_422(api: Api, body: dict) -> None:
    assert api.post("/webhooks", body).status_code == 422


def test_a_flat_webhook_body_is_taken_on_stock_and_refused_contract(api: Api, contract_api: Api) -> None:
    flat = {"url": "http://127.0.0.1:9/flat", "subscriptions": ["message_created"]}
    taken = api.post("/webhooks", flat)
    assert taken.status_code == 200
    assert taken.json()["payload"]["webhook"]["url"] == flat["url"]
    assert contract_api.post("/webhooks", flat).status_code == 422


def test_a_webhook_url_the_account_has_is_422_on_stock(api: Api, contract_api: Api) -> None:
    body = {"webhook": {"url": "http://127.0.0.1:9/same", "subscriptions": ["message_updated"]}}
    assert api.post("/webhooks", body).status_code == 200
    again = api.post("/webhooks", body)
    assert again.status_code == 422
    assert again.json() == {"message": "Url has already been taken", "attributes": ["url"]}
    assert len(api.get("/webhooks").json()["payload"]["webhooks"]) == 1
    # the contract shows no such rule: a second subscription is made
    assert contract_api.post("/webhooks", body).status_code == 200
    assert contract_api.post("/webhooks", body).status_code == 200


def test_account_two_sees_only_its_own_data(sandbox: SandboxProcess) -> None:
    other = Api(sandbox, token=OTHER_TOKEN, account_id=2)
    try:
        assert [i["id"] for i in other.get("/inboxes").json()["payload"]] == [6]
        assert other.get("/conversations/1/messages").status_code == 404
    finally:
        other.close()


def test_contact_search_is_limited_to_100_a_minute_per_account_on_stock(sandbox: SandboxProcess) -> None:
    # given the stock profile at its defaults: 100 searches a minute per account
    api, other = Api(sandbox), Api(sandbox, token=OTHER_TOKEN, account_id=2)
    try:
        statuses = [api.get("/contacts/search", params={"q": "a"}).status_code for _ in range(101)]
        refused = api.get("/contacts/search", params={"q": "a"})
        other_status = other.get("/contacts/search", params={"q": "a"}).status_code
    finally:
        api.close()
        other.close()
    # then the 101st is refused the stock way, and the other account is not affected
    assert statuses[:100] == [200] * 100 and statuses[100] == 429
    assert refused.status_code == 429
    assert refused.headers["content-type"].startswith("text/plain")
    assert refused.text == "Retry later"
    assert "retry-after" not in refused.headers
    assert other_status == 200


def test_contact_search_limit_per_account() -> None:
    with running_sandbox("[behaviour]\ncontact_search_per_minute = 3\n") as sb:
        api = Api(sb)
        statuses = [api.get("/contacts/search", params={"q": "a"}).status_code for _ in range(4)]
        api.close()
    assert statuses == [200, 200, 200, 429]


def test_the_profile_comes_from_the_file_and_the_command_line_wins() -> None:
    other = {"api_access_token": OTHER_TOKEN}
    with running_sandbox('profile = "contract"\n') as from_file:
        assert httpx.get(f"{from_file.api_url}/inboxes", headers=other, trust_env=False).status_code == 403
    with running_sandbox('profile = "contract"\n', profile="stock") as overridden:
        assert httpx.get(f"{overridden.api_url}/inboxes", headers=other, trust_env=False).status_code == 401


def test_an_unknown_profile_stops_the_sandbox_with_exit_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('profile = "chatwoot"\n')
    result = subprocess.run([sys.executable, "-m", "sandbox", "--config", str(config), "--in-memory"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=False,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 2
    assert result.stderr.startswith("sandbox: cannot load config:") and "profile" in result.stderr
