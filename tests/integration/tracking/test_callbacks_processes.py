"""Outcome callbacks with every part real: the sandbox sends and reports, the receiver and two
consumers apply the reports, a worker sends and delivers the callbacks, beat runs the sweeps; the
host's callback endpoint is an HTTP server in this test that verifies every delivery twice, with
its own HMAC code and with the ``standardwebhooks`` library, and refuses the first one (503) so
that a retry is seen."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks import Webhook

from tests.integration.tracking.test_tracking_processes import BEHAVIOUR, stack_factory
from tests.support.dispatcher_setup import reminder
from tests.support.sandbox_process import free_port, running_sandbox
from tests.support.worker_process import wait_until

__all__ = ["stack_factory"]  # the fixture: sandbox, receiver, consumers, worker and beat as processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SECRET = "whsec_" + base64.b64encode(b"callback-secret-for-the-test-32b").decode()
PHONES = {"cb-read": "+15550501201", "cb-fell-back": "+15550107201"}


class HostEndpoint:
    """The host's callback URL: keeps what verified, answers 503 to the very first delivery."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []  # (webhook-id, payload)
        self.refused_first: str | None = None
        self.bad: list[str] = []
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {key.lower(): value for key, value in self.headers.items()}
                status = endpoint.take(body, headers)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/notifications"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, body: bytes, headers: dict[str, str]) -> int:
        own = _own_verification(body, headers)
        try:
            library = Webhook(SECRET).verify(body, headers)
        except Exception as error:  # noqa: BLE001 - any refusal is a failure of the test
            self.bad.append(f"library: {error}")
            return 400
        if own != library:
            self.bad.append("own check and library disagree")
            return 400
        with self.lock:
            if self.refused_first is None:
                self.refused_first = headers["webhook-id"]
                return 503
            self.received.append((headers["webhook-id"], library))
        return 204

    def events_of(self, event_id: str) -> list[dict[str, Any]]:
        with self.lock:
            unique = {webhook_id: payload for webhook_id, payload in self.received}  # a host de-duplicates by id
        return sorted((p for p in unique.values() if p["data"]["event_id"] == event_id), key=lambda p: p["data"]["sequence"])


def _own_verification(body: bytes, headers: dict[str, str]) -> dict[str, Any] | None:
    """What a host without the library writes: the signed content, HMAC-SHA256, any v1 signature."""
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(base64.b64decode(SECRET.removeprefix("whsec_")), signed,
                                         hashlib.sha256).digest()).decode()
    offered = [part.split(",", 1)[1] for part in headers["webhook-signature"].split() if part.startswith("v1,")]
    return json.loads(body) if any(hmac.compare_digest(expected, sig) for sig in offered) else None


@pytest.fixture()
def host() -> Iterator[HostEndpoint]:
    endpoint = HostEndpoint()
    yield endpoint
    endpoint.server.shutdown()
    endpoint.server.server_close()


def test_a_host_is_told_each_outcome_in_order_signed_once_per_event(stack_factory: Any, host: HostEndpoint) -> None:
    with running_sandbox(BEHAVIOUR) as sandbox:
        stack = stack_factory(sandbox, DISPATCHER_CALLBACK_URL=host.url, DISPATCHER_CALLBACK_SECRETS=SECRET)
        for event_id, phone in PHONES.items():
            stack.dispatcher.notify(reminder(event_id, identifier=f"p-{event_id}", phone=phone))
        stack.dispatcher.notify({**reminder("cb-cancelled", identifier="p-c", phone="+15550501202"),
                                 "send_at": "2099-01-01T09:00:00+00:00"})
        stack.dispatcher.cancel("cb-cancelled")

        def told(event_id: str, last: str) -> bool:
            events = host.events_of(event_id)
            return bool(events) and events[-1]["type"] == last
        wait_until(lambda: told("cb-read", "notification.read") and told("cb-fell-back", "notification.delivered")
                   and told("cb-cancelled", "notification.cancelled"), timeout_s=120, what="every outcome told")

    assert host.bad == []
    assert host.refused_first is not None and host.refused_first in {webhook_id for webhook_id, _ in host.received}
    for event_id in (*PHONES, "cb-cancelled"):
        events = host.events_of(event_id)
        assert [e["data"]["sequence"] for e in events] == list(range(1, len(events) + 1)), event_id  # none missing
        assert all(e["data"]["state"] == e["type"].removeprefix("notification.").replace("fell_back", "falling_back")
                   for e in events)
    fell_back = [(e["type"], e["data"]["attempt"], e["data"]["channel"]) for e in host.events_of("cb-fell-back")]
    assert fell_back[0] in {("notification.accepted", 1, "messaging_platform"), ("notification.sent", 1, "messaging_platform")}
    assert ("notification.fell_back", 2, "sms") in fell_back  # the attempt that starts, through its route's channel
    assert fell_back[-1] == ("notification.delivered", 2, "sms")  # an SMS is never read
    assert [e["type"] for e in host.events_of("cb-cancelled")] == ["notification.cancelled"]
    everything = json.dumps([payload for _, payload in host.received])
    assert not any(phone in everything for phone in PHONES.values()) and "appointment" not in everything
