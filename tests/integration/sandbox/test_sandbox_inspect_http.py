"""Inspection endpoints under /_sandbox/, the launcher, and the command line."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from sandbox_helpers import Api

from tests.support.sandbox_process import REPO_ROOT, SandboxCrashed, SandboxProcess, running_sandbox

pytestmark = pytest.mark.integration


def test_health(sandbox: SandboxProcess) -> None:
    assert sandbox.health()["status"] == "ok"


def test_messages_lists_everything_with_filters(api: Api, sandbox: SandboxProcess) -> None:
    sms = api.conversation(2, phone_number="+15556000001")
    portal = api.conversation(5, identifier="insp-1")
    api.send(sms["id"], {"content": "one"})
    template = {"name": "x", "category": "UTILITY", "language": "en", "processed_params": {}}
    api.send(portal["id"], {"content": "two", "template_params": template})
    rows = sandbox.messages()
    assert {r["content"] for r in rows} == {"one", "two"}
    row = sandbox.messages(inbox_id=5)[0]
    assert row["conversation_id"] == portal["id"]
    assert row["template_name"] == "x"
    assert {"contact_id", "status", "external_error", "created_at"} <= set(row)
    assert [r["content"] for r in sandbox.messages(conversation_id=sms["id"])] == ["one"]
    assert sandbox.messages(status="failed") == []
    assert sandbox.client.get("/_sandbox/messages", params={"inbox_id": "x"}).status_code == 400


def test_stats_count_calls_per_operation_and_reset_zeroes_them(api: Api, sandbox: SandboxProcess) -> None:
    api.get("/inboxes")
    api.get("/inboxes")
    api.get("/webhooks")
    assert sandbox.stats()["calls"] == {"listInboxes": 2, "listWebhooks": 1}
    sandbox.reset()
    assert sandbox.stats()["calls"] == {}


def test_reset_returns_to_the_seed(api: Api, sandbox: SandboxProcess) -> None:
    api.contact(5, identifier="gone-after-reset")
    sandbox.reset()
    assert api.get("/contacts/search", params={"q": "gone"}).json()["payload"] == []
    again = api.contact(5, identifier="gone-after-reset")
    assert again["contact"]["id"] == 1  # ids start again too


def test_a_revoked_token_is_refused_until_reset(api: Api, sandbox: SandboxProcess) -> None:
    assert api.get("/inboxes").status_code == 200
    assert sandbox.revoke_token() == {"revoked": True}
    refused = api.get("/inboxes")
    assert (refused.status_code, refused.json()) == (401, {"error": "Invalid Access Token"})
    again = sandbox.client.post("/_sandbox/tokens/revoke", json={"token": sandbox.token})
    assert again.status_code == 404 and sandbox.token not in again.text  # the answer never echoes a token
    assert sandbox.client.post("/_sandbox/tokens/revoke", json={}).status_code == 422
    sandbox.reset()
    assert api.get("/inboxes").status_code == 200


def test_incoming_refuses_unknown_contact_and_validates(sandbox: SandboxProcess) -> None:
    unknown = sandbox.client.post("/_sandbox/incoming", json={"contact_id": 99, "inbox_id": 1})
    invalid = sandbox.client.post("/_sandbox/incoming", json={"inbox_id": 1})
    assert (unknown.status_code, invalid.status_code) == (404, 422)


def test_launcher_surfaces_a_bad_config() -> None:
    with pytest.raises(SandboxCrashed, match="cannot load config"):
        with running_sandbox("[behaviour]\nno_such_key = 1\n"):
            pass


def test_launcher_reports_a_crash_during_the_test() -> None:
    with pytest.raises(SandboxCrashed, match="exited"):
        with running_sandbox() as sb:
            sb.proc.kill()
            sb.proc.wait(timeout=5)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{sb.base_url}/_sandbox/health", trust_env=False, timeout=1)


def test_cli_help_documents_every_option() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sandbox", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    for option in ("--host", "--port", "--config", "--log-level"):
        assert option in result.stdout


def test_debug_logs_carry_no_content_phone_or_token() -> None:
    with running_sandbox(extra_args=["--log-level", "debug"]) as sb:
        api = Api(sb)
        conv = api.conversation(2, phone_number="+15556000099")
        api.send(conv["id"], {"content": "blood test result"})
        api.get("/contacts/search", params={"q": "+15556000099"})
        api.close()
        log = sb.stderr_text()
    assert "sandbox ready" in log and "call createMessage" in log  # the log is there, at debug level
    for secret in ("+15556000099", "15556000099", "blood test", sb.token):
        assert secret not in log
