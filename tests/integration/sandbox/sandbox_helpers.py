"""Helpers for the sandbox integration tests: a polling wait, an API client, a webhook receiver.

The receiver verifies signatures with its own HMAC code (not ``sandbox.webhooks.sign``), so the
sandbox's signing is checked by an independent implementation of the contract's rule.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.support.sandbox_process import SandboxProcess

FAST_CONFIG = """
[behaviour]
delivered_after_s = 0.05
read_after_s = 0.05
failed_after_s = 0.05

[webhooks]
retry_delay_s = 0.05
timeout_s = 2.0
"""


def wait_for(predicate: Callable[[], Any], *, timeout_s: float = 5.0, interval_s: float = 0.02) -> Any:
    """Poll until ``predicate()`` is truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s (last value {value!r})")
        time.sleep(interval_s)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    signature_ok: bool
    at: float

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """A threaded HTTP server on a free loopback port that records and checks deliveries."""

    prefix: str = "Chatwoot"  # the stock profile's; "Service" for the contract profile
    secret: str = ""
    statuses: list[int] = field(default_factory=list)  # answers in order, then 200
    delay_s: float = 0.0
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def verify(self, headers: dict[str, str], body: bytes) -> bool:
        """Independent check of the contract's rule: sha256=hex(HMAC(secret, ts + "." + body))."""
        timestamp = headers.get(f"x-{self.prefix.lower()}-timestamp", "")
        signature = headers.get(f"x-{self.prefix.lower()}-signature", "")
        expected = hmac.new(self.secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        return bool(timestamp) and hmac.compare_digest(signature, "sha256=" + expected)

    def events(self, name: str | None = None) -> list[Received]:
        with self.lock:
            return [r for r in self.received if name is None or r.json.get("event") == name]

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                with receiver.lock:
                    receiver.received.append(
                        Received(self.path, headers, body, receiver.verify(headers, body), time.monotonic())
                    )
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class Api:
    """Thin helper over httpx for the contract paths of one sandbox account."""

    def __init__(self, sb: SandboxProcess, *, token: str | None = None, account_id: int | None = None) -> None:
        self.sb = sb
        self.account_id = account_id or sb.account_id
        self.client = httpx.Client(
            base_url=f"{sb.base_url}/api/v1/accounts/{self.account_id}",
            headers={"api_access_token": token or sb.token},
            timeout=10.0,
            trust_env=False,
        )

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.client.get(path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        return self.client.post(path, json=body, **kw) if body is not None else self.client.post(path, **kw)

    def contact(self, inbox_id: int, **fields: Any) -> dict[str, Any]:
        response = self.post("/contacts", {"inbox_id": inbox_id, **fields})
        assert response.status_code == 200, response.text
        return response.json()["payload"]

    def conversation(self, inbox_id: int, **contact_fields: Any) -> dict[str, Any]:
        """A new contact on ``inbox_id`` and a conversation with it; returns the conversation."""
        created = self.contact(inbox_id, **contact_fields)
        body = {
            "source_id": created["contact_inbox"]["source_id"],
            "inbox_id": inbox_id,
            "contact_id": created["contact"]["id"],
        }
        response = self.post("/conversations", body)
        assert response.status_code == 200, response.text
        return response.json()

    def send(self, conversation_id: int, body: dict[str, Any]) -> httpx.Response:
        return self.post(f"/conversations/{conversation_id}/messages", body)

    def webhook(self, url: str, subscriptions: list[str], **extra: Any) -> dict[str, Any]:
        response = self.post("/webhooks", {"webhook": {"url": url, "subscriptions": subscriptions, **extra}})
        assert response.status_code == 200, response.text
        return response.json()["payload"]["webhook"]

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def message_status(sb: SandboxProcess, message_id: int) -> str | None:
    rows = [m for m in sb.messages() if m["id"] == message_id]
    return rows[0]["status"] if rows else None
