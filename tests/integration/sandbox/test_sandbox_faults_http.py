"""Injected faults over real HTTP: latency, 5xx, 429, timeouts and "commit, then drop the response"."""

from __future__ import annotations

import time

import httpx
import pytest
from sandbox_helpers import Api, wait_for

from tests.support.sandbox_process import SandboxProcess, running_sandbox

pytestmark = pytest.mark.integration


def test_server_error_share(api: Api, sandbox: SandboxProcess) -> None:
    sandbox.set_faults({"listInboxes": {"server_error_share": 1.0}})
    response = api.get("/inboxes")
    assert response.status_code == 503
    assert "error" in response.json()
    assert sandbox.stats()["faults"]["listInboxes"] == {"server_error": 1}


def test_rate_limit_share_answers_text_plain_without_retry_after(api: Api, sandbox: SandboxProcess) -> None:
    sandbox.set_faults({"searchContacts": {"rate_limit_share": 1.0}})
    response = api.get("/contacts/search", params={"q": "a"})
    assert response.status_code == 429
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "Retry later"
    assert "retry-after" not in response.headers


def test_shares_are_partial_and_replay_with_the_seed(api: Api, sandbox: SandboxProcess) -> None:
    sandbox.set_faults({"listInboxes": {"server_error_share": 0.5}})
    first = [api.get("/inboxes").status_code for _ in range(40)]
    sandbox.reset()
    sandbox.set_faults({"listInboxes": {"server_error_share": 0.5}})
    second = [api.get("/inboxes").status_code for _ in range(40)]
    assert 5 < first.count(503) < 35
    assert first == second


def test_added_latency(api: Api, sandbox: SandboxProcess) -> None:
    sandbox.set_faults({"listWebhooks": {"latency_s": 0.3}})
    began = time.monotonic()
    assert api.get("/webhooks").status_code == 200
    assert time.monotonic() - began >= 0.3


def test_timeout_then_close_does_not_run_the_operation(api: Api, sandbox: SandboxProcess) -> None:
    conv = api.conversation(5, identifier="timeout-close")
    sandbox.set_faults({"createMessage": {"timeout_share": 1.0, "timeout_s": 0.3, "timeout_then": "close"}})
    with pytest.raises(httpx.RemoteProtocolError):
        api.send(conv["id"], {"content": "x"})
    with pytest.raises(httpx.ReadTimeout):
        api.client.post(f"/conversations/{conv['id']}/messages", json={"content": "y"}, timeout=0.1)
    time.sleep(0.3)
    assert sandbox.messages(conversation_id=conv["id"]) == []


def test_timeout_then_answer_commits_after_the_client_gave_up(api: Api, sandbox: SandboxProcess) -> None:
    conv = api.conversation(5, identifier="timeout-answer")
    sandbox.set_faults({"createMessage": {"timeout_share": 1.0, "timeout_s": 0.4, "timeout_then": "answer"}})
    with pytest.raises(httpx.ReadTimeout):
        api.client.post(f"/conversations/{conv['id']}/messages", json={"content": "late"}, timeout=0.1)
    rows = wait_for(lambda: sandbox.messages(conversation_id=conv["id"]))
    assert [r["content"] for r in rows] == ["late"]


def test_commit_then_drop_closes_without_a_response_but_keeps_the_message(api: Api, sandbox: SandboxProcess) -> None:
    conv = api.conversation(2, phone_number="+15559000001")
    sandbox.set_faults({"createMessage": {"drop_response_share": 1.0}})
    with pytest.raises(httpx.RemoteProtocolError):  # a transport error, not a 5xx
        api.send(conv["id"], {"content": "did it go?"})
    rows = sandbox.messages(conversation_id=conv["id"])
    assert [r["content"] for r in rows] == ["did it go?"]
    listed = api.get(f"/conversations/{conv['id']}/messages").json()["payload"]
    assert [m["content"] for m in listed] == ["did it go?"]  # the client can find it before resending
    assert sandbox.stats()["faults"]["createMessage"] == {"drop": 1}
    assert wait_for(lambda: sandbox.messages(conversation_id=conv["id"])[0]["status"] == "delivered", timeout_s=5)


def test_commit_then_hang_until_the_client_times_out(api: Api, sandbox: SandboxProcess) -> None:
    conv = api.conversation(5, identifier="hang")
    sandbox.set_faults({"createMessage": {"drop_response_share": 1.0, "drop_mode": "hang", "hang_s": 2.0}})
    with pytest.raises(httpx.ReadTimeout):
        api.client.post(f"/conversations/{conv['id']}/messages", json={"content": "held"}, timeout=0.2)
    assert [r["content"] for r in sandbox.messages(conversation_id=conv["id"])] == ["held"]


def test_a_refused_operation_is_not_dropped(api: Api, sandbox: SandboxProcess) -> None:
    sandbox.set_faults({"createMessage": {"drop_response_share": 1.0}})
    assert api.send(404, {"content": "x"}).status_code == 404


def test_faults_are_read_replaced_validated_and_reset(sandbox: SandboxProcess) -> None:
    sandbox.set_faults({"createMessage": {"latency_s": 0.1}})
    assert sandbox.faults()["faults"]["createMessage"]["latency_s"] == 0.1
    bad_op = sandbox.client.put("/_sandbox/faults", json={"sendEverything": {"latency_s": 1}})
    bad_value = sandbox.client.put("/_sandbox/faults", json={"createMessage": {"server_error_share": 2}})
    assert (bad_op.status_code, bad_value.status_code) == (422, 422)
    sandbox.set_faults({"listInboxes": {"rate_limit_share": 0.1}})
    assert set(sandbox.faults()["faults"]) == {"listInboxes"}  # PUT replaces the whole table
    sandbox.reset()
    assert sandbox.faults()["faults"] == {}


def test_faults_from_the_config_file_apply_from_the_start() -> None:
    config = "[faults.listInboxes]\nrate_limit_share = 1.0\n"
    with running_sandbox(config) as sb:
        response = httpx.get(f"{sb.api_url}/inboxes", headers=sb.headers, trust_env=False)
        other = httpx.get(f"{sb.api_url}/webhooks", headers=sb.headers, trust_env=False)
        sb.reset()
        still = httpx.get(f"{sb.api_url}/inboxes", headers=sb.headers, trust_env=False)
    assert (response.status_code, other.status_code, still.status_code) == (429, 200, 429)


def test_a_dropped_response_leaves_no_traceback_in_the_log(sandbox: SandboxProcess, api: Api) -> None:
    conv = api.conversation(5, identifier="quiet")
    sandbox.set_faults({"createMessage": {"drop_response_share": 1.0}})
    with pytest.raises(httpx.RemoteProtocolError):
        api.send(conv["id"], {"content": "secret health detail"})
    log = sandbox.stderr_text()
    assert "Traceback" not in log
    assert "secret health detail" not in log
