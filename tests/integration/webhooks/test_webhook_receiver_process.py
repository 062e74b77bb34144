"""The real receiver process (started through its CLI command) against the sandbox's signed
deliveries, a fresh PostgreSQL database and a Redis broker, all on loopback.

Checked: each delivery is recorded once; a replayed delivery ID is answered 2xx and not stored
again; the published tasks sit in the broker list ``dispatcher.outcomes`` with the row IDs; a
tampered request is refused 401 and leaves no row; neither the log nor the stored summaries hold
content, phone numbers, the API token or the secret.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import sqlalchemy as sa
from click.testing import CliRunner

from dispatcher.operations.cli.webhook_commands import webhooks_group
from dispatcher.store.migrate import upgrade_database
from tests.conftest import REPO_ROOT
from tests.support.ports import listens
from tests.support.sandbox_process import SandboxProcess, free_port, running_sandbox
from tests.support.worker_process import dispatcher_environment

pytestmark = pytest.mark.integration

PATH = "/webhooks/messaging"
CONTENT = "Reminder: cardiology check-up on Friday 10:00"
PHONES = ["+15558100001", "+15558100002", "+15558100003"]
SMS_INBOX = 2
BROKER_DB = 5  # outside 8-15, which tests.support.worker_process.fresh_broker_url draws from
SANDBOX_CONFIG = """
[behaviour]
delivered_after_s = 0.05
read_after_s = 0.05

[webhooks]
retry_delay_s = 0.1
timeout_s = 2.0
"""


def wait_for(predicate: Callable[[], Any], *, timeout_s: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not met within {timeout_s} s (last value {value!r})")
        time.sleep(0.05)


def sign(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


@dataclass
class Stack:
    sandbox: SandboxProcess
    receiver_url: str
    secret: str
    prefix: str
    engine: sa.Engine
    broker: redis.Redis
    log_path: Path
    process: subprocess.Popen[bytes]

    def rows(self) -> list[Any]:
        with self.engine.connect() as connection:
            return list(connection.execute(sa.text(
                "SELECT id, delivery_id, event, summary FROM webhook_deliveries ORDER BY id")).all())

    def published_row_ids(self) -> list[int]:
        ids = []
        for raw in self.broker.lrange("dispatcher.outcomes", 0, -1):
            message = json.loads(raw)
            args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
            assert kwargs == {}
            if message["headers"]["task"] == "dispatcher.outcomes":  # a group commit's rows, applied together
                assert message["headers"]["argsrepr"] == f"(deliveries={len(args[0])})" and len(args[0]) > 1
                ids += args[0]
            else:
                assert message["headers"]["task"] == "dispatcher.outcome"
                assert message["headers"]["argsrepr"] == f"(delivery={args[0]})"
                ids.append(args[0])
        return sorted(ids)

    def post_signed(self, body: bytes, delivery_id: str, *, signed_body: bytes | None = None) -> httpx.Response:
        timestamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", f"X-{self.prefix}-Delivery": delivery_id,
                   f"X-{self.prefix}-Timestamp": timestamp,
                   f"X-{self.prefix}-Signature": sign(self.secret, timestamp, signed_body or body)}
        return httpx.post(self.receiver_url, content=body, headers=headers, timeout=5.0, trust_env=False)

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running_stack(tmp_path: Path, database_url: str, redis_url: str, *, profile: str, prefix_setting: str,
                  webhooks: str) -> Iterator[Stack]:
    upgrade_database(database_url)
    broker_url = f"{redis_url.rstrip('/')}/{BROKER_DB}"
    broker = redis.Redis.from_url(broker_url)
    broker.flushdb()
    config = SANDBOX_CONFIG.replace("[webhooks]", f"[webhooks]\n{webhooks}")
    prefix = "Chatwoot" if profile == "stock" else "Service"
    engine = sa.create_engine(database_url)
    with running_sandbox(config, profile=profile) as sandbox:
        port = free_port()
        receiver_url = f"http://127.0.0.1:{port}{PATH}"
        env = dispatcher_environment(api_url=sandbox.base_url, database_url=database_url, broker_url=broker_url)
        registered = CliRunner().invoke(webhooks_group, ["register", "--url", receiver_url, "--name", "it"], env=env)
        assert registered.exit_code == 0, registered.output
        secret = registered.output.splitlines()[-1]
        env.update(DISPATCHER_WEBHOOK_SECRETS=f"{secret},an-old-secret", DISPATCHER_WEBHOOK_HEADER_PREFIX=prefix_setting)
        log_path = tmp_path / "receiver.log"
        command = ("import sys; from dispatcher.operations.cli.webhook_commands import receiver_command; "
                   "receiver_command(sys.argv[1:])")
        with log_path.open("wb") as log:
            process = subprocess.Popen([sys.executable, "-c", command, "--host", "127.0.0.1", "--port", str(port)],
                                       cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        stack = Stack(sandbox, receiver_url, secret, prefix, engine, broker, log_path, process)
        try:
            wait_for(lambda: _healthy(port, process), timeout_s=15.0, what="receiver /healthz")
            yield stack
        finally:
            stack.stop()
            engine.dispose()
            broker.flushdb()


def _healthy(port: int, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        pytest.fail(f"the receiver exited with {process.returncode}")
    try:
        answered = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False
    return answered and listens(process.pid, port)  # its own answer, not another test's receiver's


def _raw_post(url: str, body: bytes, headers: dict[str, str]) -> bytes:
    """A POST written byte by byte (an HTTP client would refuse to frame a body twice)."""
    parts = urlsplit(url)
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    request = f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n{head}\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=5.0) as connection:
        connection.sendall(request.encode() + chunked)
        answer = b""
        while chunk := connection.recv(4096):
            answer += chunk
    return answer


def send_messages(sandbox: SandboxProcess) -> tuple[list[int], int]:
    """One outgoing message to each of three SMS contacts and one incoming message; returns the
    outgoing message IDs and the contact ID that wrote in."""
    message_ids, contact_ids = [], []
    with httpx.Client(base_url=sandbox.api_url, headers=sandbox.headers, timeout=5.0, trust_env=False) as api:
        for n, phone in enumerate(PHONES):
            created = api.post("/contacts", json={"inbox_id": SMS_INBOX, "name": f"Patient {n}", "phone_number": phone})
            created.raise_for_status()
            payload = created.json()["payload"]
            contact_ids.append(payload["contact"]["id"])
            conversation = api.post("/conversations", json={"source_id": payload["contact_inbox"]["source_id"],
                                                            "inbox_id": SMS_INBOX, "contact_id": contact_ids[-1]})
            conversation.raise_for_status()
            message = api.post(f"/conversations/{conversation.json()['id']}/messages",
                               json={"content": CONTENT, "message_type": "outgoing"})
            message.raise_for_status()
            message_ids.append(message.json()["id"])
    sandbox.incoming(contact_id=contact_ids[0], inbox_id=SMS_INBOX, content="Can I come at 11 instead?")
    return message_ids, contact_ids[0]


def all_delivered(sandbox: SandboxProcess, events: int) -> dict[str, Any] | None:
    stats = sandbox.stats()
    hooks = stats["webhooks"]
    done = (hooks.get("events", 0) >= events and stats["pending_webhooks"] == 0
            and hooks.get("delivered", 0) == hooks.get("events", 0) + hooks.get("duplicated", 0))
    return hooks if done else None


@pytest.mark.parametrize(("profile", "prefix_setting", "webhooks", "with_status"), [
    ("contract", "Service", "duplicate_share = 0.5\nconcurrency = 4", True),
    ("stock", "auto", "", False),
], ids=["contract-profile-with-duplicates", "stock-profile-default-receiver"])
def test_the_receiver_records_queues_and_refuses(
    tmp_path: Path, fresh_postgres_url: str, redis_url: str, profile: str, prefix_setting: str, webhooks: str,
    with_status: bool,
) -> None:
    with running_stack(tmp_path, fresh_postgres_url, redis_url, profile=profile, prefix_setting=prefix_setting,
                       webhooks=webhooks) as stack:
        # given three outgoing SMS messages (created; the provider's id, delivered: an SMS is never read) and one
        # incoming message
        message_ids, writer = send_messages(stack.sandbox)
        expected_events = 3 * len(message_ids) + 1
        # when the sandbox has delivered every event (and its duplicates under new IDs)
        hooks = wait_for(lambda: all_delivered(stack.sandbox, expected_events), what="all deliveries")
        rows = wait_for(lambda: (r := stack.rows()) and len(r) == hooks["delivered"] and r, what="rows")

        # then each delivery is one row, and each row ID was published once
        assert hooks["events"] == expected_events and hooks.get("gave_up", 0) == 0
        assert len({row.delivery_id for row in rows}) == len(rows) == expected_events + hooks.get("duplicated", 0)
        assert stack.published_row_ids() == [row.id for row in rows]
        summaries = [row.summary for row in rows]
        updates = [s for s in summaries if s["event"] == "message_updated"]
        assert {s["message_id"] for s in updates} == set(message_ids)
        assert all(s["conversation_display_id"] is not None for s in summaries)
        # the contract's events carry the status; a stock event carries its message's own only when that message
        # is its conversation's latest (conversation.messages[0]): the last two are, the first had a reply after it
        latest_statuses = {s["status"] for s in updates if s["message_id"] in message_ids[1:]}
        assert latest_statuses == {"sent", "delivered"}
        assert {s["status"] for s in updates} <= {"sent", "delivered"} | (set() if with_status else {None})
        incoming = [s for s in summaries if s["message_type"] == "incoming"]
        assert incoming and {s["contact_id"] for s in incoming} == {writer}

        # and a replayed delivery ID is acknowledged and not stored or queued again
        body = json.dumps({"event": "message_updated", "id": message_ids[0], "status": "read"}).encode()
        first, again = stack.post_signed(body, "test-replay-1"), stack.post_signed(body, "test-replay-1")
        assert (first.status_code, first.json()) == (200, {"status": "accepted"})
        assert (again.status_code, again.json()) == (200, {"status": "duplicate"})
        assert len(stack.rows()) == len(rows) + 1
        assert len(stack.published_row_ids()) == len(rows) + 1

        # and a tampered request is refused and leaves nothing
        tampered = stack.post_signed(body.replace(b'"read"', b'"failed"'), "test-tampered-1", signed_body=body)
        assert (tampered.status_code, tampered.json()) == (401, {"error": "bad_signature"})
        assert "test-tampered-1" not in {row.delivery_id for row in stack.rows()}
        assert len(stack.published_row_ids()) == len(rows) + 1

        # and a signed body holding a NUL or a lone surrogate is refused: nothing could store or apply it
        for n, text in enumerate(("a\\u0000b", "\\ud800", "\\udc00 alone")):
            unstorable = f'{{"event": "message_updated", "id": {message_ids[0]}, "content": "{text}"}}'.encode()
            refused = stack.post_signed(unstorable, f"test-unstorable-{n}")
            assert (refused.status_code, refused.json()) == (400, {"error": "malformed_body"}), text
        # while an escaped pair (an emoji) and the stock escapes of <, > and & are accepted
        paired = (f'{{"event": "message_updated", "id": {message_ids[0]}, '
                  '"content": "\\ud83d\\ude00 \\u003cb\\u003e"}').encode()
        assert stack.post_signed(paired, "test-paired").status_code == 200
        delivery_ids = {row.delivery_id for row in stack.rows()}
        assert "test-paired" in delivery_ids and not any(d.startswith("test-unstorable") for d in delivery_ids)
        assert len(stack.published_row_ids()) == len(rows) + 2

        # and a request framed twice (Transfer-Encoding and Content-Length: a smuggling attempt) is refused
        framed_twice = _raw_post(stack.receiver_url, body, {"Content-Length": str(len(body)), "Transfer-Encoding": "chunked"})
        assert framed_twice.startswith(b"HTTP/1.1 400"), framed_twice[:80]
        assert b"transfer-encoding" in framed_twice
        assert len(stack.published_row_ids()) == len(rows) + 2

        # and nothing personal or secret is stored or logged
        log = stack.stop()
        stored = json.dumps([row.summary for row in stack.rows()])
    assert "webhook delivery test-tampered-1 refused: bad_signature (401)" in log
    for private in (CONTENT, "Can I come at 11", *PHONES, *(p.lstrip("+") for p in PHONES), "Patient 0",
                    stack.sandbox.token, stack.secret):
        assert private not in log
        assert private not in stored


def test_registering_a_url_twice_on_a_stock_workspace_says_what_to_do(clean_environment: pytest.MonkeyPatch) -> None:
    # given a stock workspace (one webhook per URL) with the receiver's URL registered once
    with running_sandbox() as sandbox:
        env = dispatcher_environment(api_url=sandbox.base_url, database_url="sqlite:///unused.sqlite",
                                     broker_url="memory://")
        url = "http://127.0.0.1:8080/webhooks/messaging"
        first = CliRunner().invoke(webhooks_group, ["register", "--url", url], env=env)
        assert first.exit_code == 0, first.output
        # when it is registered again, then one line says why and what to do, exit 1
        again = CliRunner().invoke(webhooks_group, ["register", "--url", url], env=env)
    assert again.exit_code == 1
    assert again.output.strip() == (
        "error: the workspace refused the webhook (HTTP 422): a webhook for this URL exists already, and a stock"
        " workspace keeps one per URL: keep using the secret it was registered with")
