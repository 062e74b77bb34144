"""The simulated workspace: the sandbox's own app, in process, on simulated time.

The sandbox (a stock workspace by default) answers our real ``WorkspaceClient`` through an
``httpx`` transport that drives its ASGI app to completion without an event loop: its handlers
never wait on anything but the request body, which is already here. Its timers (a message's
provider id, delivered, read, failed) are ``loop.call_later`` calls, caught by :class:`SimLoop`
and fired by the scheduler when simulated time reaches them. Its webhook deliveries stay in its
own queue until the scheduler hands them to our receiver (in order, late, twice, or never).

Faults the scheduler may inject on a call: 429 with and without Retry-After, 500, 401, 404, a
connection that fails before the request reaches the workspace, and a request the workspace
carries out whose answer is lost (a read timeout).
"""

from __future__ import annotations

import asyncio
import heapq
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import httpx

from sandbox.app import create_app
from sandbox.config import RecipientRule, SandboxConfig, load_config
from sandbox.records import MESSAGE_OUTGOING, MessageRec
from sandbox.runtime import Sandbox
from sandbox.webhooks import Delivery, sign

TOKEN = "sandbox-token-account-1"
RECEIVER_URL = "http://127.0.0.1:8000/webhooks/messaging"
WORKSPACE_URL = "http://sandbox.test"

# Fault kinds the scheduler may inject on one API call (0 is "no fault"). The last two are drawn
# only in the worlds that ask for them, so that the other worlds keep the draws their regression
# seeds were recorded with: a refusal the stock workspace answers when a conversation gets too many
# messages (422, worlds with ``refusals``), and a success no one can read, a gateway's page answered
# in the workspace's place, the call never reaching it (worlds with ``unreadable_answers``).
CALL_FAULTS = ("none", "429 retry-after", "429", "500", "401", "404", "connect error", "answer lost", "422",
               "answer unreadable")
BASE_FAULTS = CALL_FAULTS[:-2]

# The stock seed's recipient rules, and one more for the simulation: a number neither channel
# reaches (a landline: the platform and the SMS provider both report it failed), so that a
# fallback's own failure happens.
UNREACHABLE_PREFIX = "+1555030"


@dataclass(order=True)
class _Timer:
    due: float
    seq: int
    callback: Callable[..., Any] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class SimLoop:
    """The little of asyncio's loop the sandbox uses (``call_later``, ``time``), on simulated time."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._timers: list[_Timer] = []
        self._seq = 0

    def time(self) -> float:
        return self._clock()

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> _Timer:
        self._seq += 1
        timer = _Timer(self._clock() + max(delay, 0.0), self._seq, callback, args)
        heapq.heappush(self._timers, timer)
        return timer

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> _Timer:
        return self.call_later(0.0, callback, *args)

    def next_due(self) -> float | None:
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0].due if self._timers else None

    def run_due(self) -> int:
        """Fire every timer due now, in order; returns how many fired."""
        fired = 0
        while (due := self.next_due()) is not None and due <= self._clock():
            timer = heapq.heappop(self._timers)
            with running(self):
                timer.callback(*timer.args)
            fired += 1
        return fired


class running:
    """Make ``loop`` the running loop while the sandbox's code runs (it asks for it)."""

    def __init__(self, loop: SimLoop) -> None:
        self.loop = loop

    def __enter__(self) -> None:
        asyncio.events._set_running_loop(self.loop)  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        asyncio.events._set_running_loop(None)


def _drive(coroutine: Any) -> None:
    """Run a coroutine that never suspends (the sandbox's handlers, given the whole body)."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("the sandbox suspended a request: it may only await the request body")


@cache
def workspace_config(profile: str = "stock") -> SandboxConfig:
    """The sandbox's configuration for a profile, read once per process, with the simulation's
    unreachable number added to its recipient rules: by default the stock workspace of the field
    notes; ``"contract"``, the contract's nominal workspace (its events carry the status)."""
    config = load_config(profile=profile)
    unreachable = RecipientRule(phone_prefix=UNREACHABLE_PREFIX, inbox_ids=[1, 2], effect="fail",
                                external_error="30003: Unreachable destination handset")
    return config.model_copy(update={"recipient_rules": [*config.recipient_rules, unreachable]})


class SimWorkspace(httpx.BaseTransport):
    """The stock sandbox behind an httpx transport, with a fault chosen per call."""

    def __init__(self, clock: Callable[[], float], choose_fault: Callable[[str], int], *, profile: str = "stock",
                 removed_inboxes: tuple[int, ...] = (), late_sent_after_s: float | None = None) -> None:
        config = workspace_config(profile)
        if late_sent_after_s is not None:  # the regress rule's late `sent`, this long after `delivered`
            behaviour = config.behaviour.model_copy(update={"late_sent_after_s": late_sent_after_s})
            config = config.model_copy(update={"behaviour": behaviour})
        self.loop = SimLoop(clock)
        self.sandbox = Sandbox(config)
        store = self.sandbox.store
        for inbox_id in removed_inboxes:  # removed before the run: nothing of theirs exists
            del store.inboxes[inbox_id]
        store.clock = clock
        for window in (self.sandbox.searches, self.sandbox.channels.sends, self.sandbox.channels.conversation_messages):
            window.clock = clock
        self.sandbox.webhooks.clock = clock
        self.app = create_app(sandbox=self.sandbox)
        self._choose_fault = choose_fault
        self.calls: list[tuple[str, str]] = []  # (operation path, what happened), for the trace
        self.webhook_secret = self._register_webhook()

    def _register_webhook(self) -> str:
        hook = self.sandbox.store.create_webhook(1, url=RECEIVER_URL, name="dispatcher", inbox_id=None,
                                                 subscriptions=["message_created", "message_updated"])
        return hook.secret

    # -- the API, as our client sees it ------------------------------------------------------
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        operation = f"{request.method} {request.url.path.split('/accounts/1', 1)[-1]}"
        fault = CALL_FAULTS[self._choose_fault(operation)]
        if fault == "connect error":
            raise httpx.ConnectError("simulated: the request never reached the workspace", request=request)
        if fault in ("429 retry-after", "429"):
            headers = {"Retry-After": "7"} if fault == "429 retry-after" else {}
            return httpx.Response(429, json={"error": "Too many requests"}, headers=headers, request=request)
        if fault == "500":
            return httpx.Response(500, json={"error": "Internal server error"}, request=request)
        if fault == "401":
            return httpx.Response(401, json={"error": "Invalid Access Token"}, request=request)
        if fault == "404":
            return httpx.Response(404, json={"error": "Resource could not be found"}, request=request)
        if fault == "422":
            return httpx.Response(422, json={"error": "Too many messages"}, request=request)
        if fault == "answer unreadable":  # a gateway's page in the workspace's place: nothing was done
            return httpx.Response(200, headers={"content-type": "text/html"},
                                  content=b"<html><body>Service temporarily unavailable</body></html>", request=request)
        status, headers, body = self.asgi(request.method, request.url.raw_path.decode(), request.content,
                                          dict(request.headers))
        if fault == "answer lost":  # the workspace did it; the answer never comes back
            raise httpx.ReadTimeout("simulated: the answer was lost", request=request)
        return httpx.Response(status, headers=headers, content=body, request=request)

    def asgi(self, method: str, raw_path: str, body: bytes, headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        path, _, query = raw_path.partition("?")
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "root_path": "",
                 "query_string": query.encode(), "http_version": "1.1", "scheme": "http",
                 "server": ("sandbox.test", 80), "client": ("127.0.0.1", 1), "app": self.app,
                 "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
        with running(self.loop):
            _drive(self.app(scope, receive, send))
        start = sent[0]
        answer_headers = [(k.decode(), v.decode()) for k, v in start.get("headers", [])]
        return start["status"], answer_headers, b"".join(m.get("body", b"") for m in sent[1:])

    # -- webhooks: deliveries wait here until the scheduler hands them over -----------------
    def pending_deliveries(self) -> list[Delivery]:
        queue: Any = self.sandbox.webhooks._queue
        return list(queue._queue)

    def take_delivery(self, index: int) -> Delivery:
        queue: Any = self.sandbox.webhooks._queue
        items = queue._queue
        delivery: Delivery = items[index]
        del items[index]
        return delivery

    def signed_headers(self, delivery: Delivery) -> dict[str, str]:
        prefix = self.sandbox.webhooks.settings.header_prefix
        timestamp = str(int(self.loop.time()))
        return {"Content-Type": "application/json", f"X-{prefix}-Delivery": delivery.delivery_id,
                f"X-{prefix}-Timestamp": timestamp, f"X-{prefix}-Signature": sign(delivery.secret, timestamp, delivery.body)}

    def customer_replies(self, conversation_display_id: int, text: str) -> int:
        """An incoming message from the customer (a STOP): stored, announced, honoured by the provider.
        Returns the message's ID."""
        conversation = self.sandbox.store.conversation(1, conversation_display_id)
        with running(self.loop):
            return self.sandbox.receive_message(conversation, content=text, age_s=0.0).id

    def customer_wrote(self, *, name: str, phone_number: str, identifier: str, age_s: float) -> None:
        """The contact wrote to the platform inbox ``age_s`` ago (before the run): the contact, its
        conversation and the incoming message exist, the service window is open until 24 hours after
        it, and its ``message_created`` waits for our receiver like any delivery."""
        store = self.sandbox.store
        contact = store.create_contact(1, name=name, phone_number=phone_number, email=None, identifier=identifier)
        conversation, _ = store.create_conversation(1, store.bind_for_creation(contact, store.inboxes[1]), status="open",
                                                    custom_attributes={}, additional_attributes={})
        with running(self.loop):
            self.sandbox.receive_message(conversation, content="Hello", age_s=age_s)

    def front_desk_contact(self, *, name: str, identifier: str, email: str) -> None:
        """The front desk made the patient's contact before the run, with an e-mail address and no
        phone number: neither the platform inbox nor the SMS inbox can reach it."""
        self.sandbox.store.create_contact(1, name=name, phone_number=None, email=email, identifier=identifier)

    def provider_opted_out(self, *, name: str, phone_number: str, identifier: str) -> None:
        """The contact replied STOP to the SMS provider before the run (before our receiver was
        set up, or its report was lost): the provider refuses SMS to it (21610) and we never heard."""
        self.sandbox.store.create_contact(1, name=name, phone_number=phone_number, email=None, identifier=identifier,
                                          sms_opted_out=True)

    @property
    def service_window_s(self) -> float:
        return self.sandbox.config.behaviour.service_window_s

    def outgoing(self) -> list[MessageRec]:
        return [m for m in self.sandbox.store.messages.values() if m.message_type == MESSAGE_OUTGOING]

    @staticmethod
    def describe(delivery: Delivery) -> str:
        body = json.loads(delivery.body)
        return f"{delivery.event} m{body.get('id')} {body.get('status') or ''}".strip()
