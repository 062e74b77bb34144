"""A refusal met by one run must not end an attempt another run is sending.

Two deliveries of one send task (a redelivery, a twin) run side by side. The second run claims
the attempt and calls createMessage; meanwhile the first, still looking the contact up, is
refused (422: final). Its failure belongs to its own lookups: the attempt is the other run's,
whose message the workspace takes. Failing that attempt would leave the message unrecorded and
fall back to SMS: a second message to the person.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.sending.send import Outcome, SendResult, send_notification
from dispatcher.store import queries as store
from tests.support.dispatcher_setup import reminder, send_context
from tests.support.sandbox_process import SandboxProcess

pytestmark = pytest.mark.integration


class RefuseLookups(httpx.HTTPTransport):
    """The first run's view of the workspace: its contact search is answered 422, once the other
    run is inside createMessage."""

    def __init__(self, other_is_sending: threading.Event) -> None:
        super().__init__()
        self.other_is_sending = other_is_sending
        self.searching = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/contacts/search"):
            self.searching.set()
            assert self.other_is_sending.wait(30), "the other run never reached createMessage"
            return httpx.Response(422, json={"error": "Too many messages"}, request=request)
        return super().handle_request(request)


class HoldCreateMessage(httpx.HTTPTransport):
    """The second run's view: its createMessage waits until the first run has finished."""

    def __init__(self, first_done: threading.Event) -> None:
        super().__init__()
        self.first_done = first_done
        self.sending = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/messages"):
            self.sending.set()
            assert self.first_done.wait(30), "the first run never finished"
        return super().handle_request(request)


def test_a_lookup_refused_in_one_run_leaves_the_attempt_another_run_is_sending(
        context: SendContext, sandbox: SandboxProcess) -> None:
    settings = context.settings
    record = intake.accept(parse_request(reminder("evt-race-422", identifier="p-race", phone="+15550300090")),
                           sessions=context.sessions, settings=settings, enqueuer=ListEnqueuer())
    with context.sessions() as session:
        notification = store.find_notification_by_event(session, record.event_id)
        assert notification is not None
        notification_id = notification.id
    first_done = threading.Event()
    hold = HoldCreateMessage(first_done)
    refuse = RefuseLookups(hold.sending)
    results: dict[str, SendResult] = {}
    with send_context(settings, transport=hold) as second, send_context(settings, transport=refuse) as first:
        def run_first() -> None:
            try:
                results["first"] = send_notification(notification_id, first)
            finally:
                first_done.set()

        first_thread = threading.Thread(target=run_first)
        first_thread.start()  # it reads the attempt (queued) and starts looking the contact up
        assert refuse.searching.wait(30)
        results["second"] = send_notification(notification_id, second)  # claims, and calls while the first is refused
        first_thread.join(30)

    assert results["first"].outcome is not Outcome.ACCEPTED  # it was refused
    assert results["second"].outcome is Outcome.ACCEPTED, results["second"].reason
    with context.sessions() as session:
        notification = store.find_notification_by_event(session, "evt-race-422")
        assert notification is not None
        attempts = store.attempts_of(session, notification.id)
    assert [(a.number, a.state, a.message_id) for a in attempts] == [(1, "sent", results["second"].message_id)]
    assert notification.fallback_decision is None
    assert len([m for m in sandbox.messages() if "evt-race-422" in (m.get("content") or "")]) == 1
