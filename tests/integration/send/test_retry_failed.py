"""A host retries a failed notification: one new attempt on its route, the same event, the same
request handed over again (its content was deleted when it failed), and never a second fallback.

The send path runs for real against the sandbox process; createMessage answers server errors (a
5xx on a write may have taken effect: the attempt looks for its message, finds none, and fails)."""

from __future__ import annotations

import pytest

from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import EventConflict, StateConflict
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.operations.retry import retry
from dispatcher.sending.send import Outcome
from dispatcher.store import queries as store
from tests.support.dispatcher_setup import drive, reminder
from tests.support.sandbox_process import SandboxProcess

pytestmark = pytest.mark.integration

SERVER_ERRORS = {"createMessage": {"server_error_share": 1.0}}


def _hand_over(context: SendContext, request: dict[str, object]) -> int:
    intake.accept(parse_request(request), sessions=context.sessions, settings=context.settings, enqueuer=ListEnqueuer())
    with context.sessions() as session:
        notification = store.find_notification_by_event(session, str(request["event_id"]))
        assert notification is not None
        return notification.id


def _attempts(context: SendContext, event_id: str) -> list[tuple[int, str, str, str, str | None]]:
    record = intake.status(context.sessions, event_id)
    return [(a.number, a.purpose, a.route, a.state, a.error_kind) for a in record.attempts]


def _payload_kept(context: SendContext, notification_id: int) -> bool:
    with context.sessions() as session:
        return store.load_payload(session, notification_id) is not None


def test_a_failed_notification_is_retried_once_asked_with_its_request(context: SendContext, sandbox: SandboxProcess) -> None:
    request = reminder("evt-retry-sms", identifier="p-retry", phone="+15550300101", route="sms")
    notification_id = _hand_over(context, request)
    sandbox.set_faults(SERVER_ERRORS)
    assert drive(context, notification_id)[-1].outcome is Outcome.FAILED
    failed = intake.status(context.sessions, "evt-retry-sms")
    assert (failed.state, failed.error_kind, failed.fallback_decision) == ("failed", "not_found_after_unknown_outcome", "none")
    assert not _payload_kept(context, notification_id)

    with pytest.raises(StateConflict, match="content was deleted"):  # nothing to send without its request
        retry(context.sessions, context.settings, ListEnqueuer(), "evt-retry-sms")
    with pytest.raises(EventConflict):
        retry(context.sessions, context.settings, ListEnqueuer(), "evt-retry-sms",
              parse_request({**request, "content": "Reminder evt-retry-sms: another text"}))
    assert _attempts(context, "evt-retry-sms") == [(1, "first", "sms", "failed", "not_found_after_unknown_outcome")]

    sandbox.set_faults({})  # the cause is gone
    enqueuer = ListEnqueuer()
    queued = retry(context.sessions, context.settings, enqueuer, "evt-retry-sms", parse_request(request))
    assert (queued.state, queued.error_kind, queued.message_id) == ("queued", None, None)
    assert queued.send_at is not None and queued.send_at >= failed.updated_at  # its send deadline counts from the retry
    assert enqueuer.sent == [notification_id]
    assert drive(context, notification_id)[-1].outcome is Outcome.ACCEPTED
    sent = intake.status(context.sessions, "evt-retry-sms")
    assert sent.state in ("accepted", "sent") and sent.message_id is not None
    assert _attempts(context, "evt-retry-sms") == [(1, "first", "sms", "failed", "not_found_after_unknown_outcome"),
                                                   (2, "retry", "sms", sent.state, None)]
    assert sandbox.messages_per_event()["evt-retry-sms"] == 1
    assert not _payload_kept(context, notification_id)  # nothing can follow the retry's message
    with pytest.raises(StateConflict, match="only a failed one"):
        retry(context.sessions, context.settings, ListEnqueuer(), "evt-retry-sms", parse_request(request))


def test_a_retry_that_fails_ends_the_notification_without_a_second_fallback(
        context: SendContext, sandbox: SandboxProcess) -> None:
    request = reminder("evt-retry-twice", identifier="p-retry-2", phone="+15550300102")  # reminders, falls back to SMS
    notification_id = _hand_over(context, request)
    sandbox.set_faults(SERVER_ERRORS)
    drive(context, notification_id)  # the first attempt fails; the fallback is decided
    assert drive(context, notification_id)[-1].outcome is Outcome.FAILED  # and fails too
    assert intake.status(context.sessions, "evt-retry-twice").fallback_decision == "fallback"

    retry(context.sessions, context.settings, ListEnqueuer(), "evt-retry-twice", parse_request(request))
    assert drive(context, notification_id)[-1].outcome is Outcome.FAILED
    ended = intake.status(context.sessions, "evt-retry-twice")
    assert (ended.state, ended.error_kind, ended.fallback_decision) == ("failed", "not_found_after_unknown_outcome", "fallback")
    assert [(number, purpose, route, state) for number, purpose, route, state, _ in _attempts(context, "evt-retry-twice")] \
        == [(1, "first", "reminders", "failed"), (2, "fallback", "sms", "failed"), (3, "retry", "reminders", "failed")]
    assert sandbox.messages_per_event()["evt-retry-twice"] == 0
    assert not _payload_kept(context, notification_id)
