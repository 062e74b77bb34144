"""Delivery tracking against a real sandbox process: outcomes applied monotonically, the single
fallback decision, reconciliation of lost webhooks, the customer-service window.

Events are handed to the consumer's code as the receiver records them (a summary per delivery);
the real receiver and consumer processes are exercised in test_tracking_processes.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from prometheus_client import REGISTRY

from dispatcher import faults
from dispatcher.api import NotFound, Unauthorized
from dispatcher.context import SendContext, Wait
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.lifecycle import moves, worklists
from dispatcher.lifecycle.states import AttemptState
from dispatcher.metrics import NotificationStates, render
from dispatcher.operations.cli.main import cli
from dispatcher.policy.channels import window_open
from dispatcher.queues import DEFAULT_WORKSPACE_NAME, Priority, send_queue
from dispatcher.recipients.keywords import normalise
from dispatcher.sending.send import Outcome
from dispatcher.store import queries as store
from dispatcher.store.account import Account
from dispatcher.store.models import Attempt, Suppression, WebhookDelivery
from dispatcher.tracking import outcomes
from dispatcher.tracking.outcomes import apply_event
from dispatcher.tracking.reconcile import READ_HOLD_S, process_deliveries, process_delivery, tracking_sweep
from dispatcher.tracking.webhooks.deliveries import NewDelivery, record_deliveries
from dispatcher.tracking.webhooks.events import EventSummary
from tests.support.dispatcher_setup import EXAMPLE as EXAMPLE_CONFIG
from tests.support.dispatcher_setup import drive, example_settings, reminder, send_context
from tests.support.sandbox_process import SandboxProcess, running_sandbox

ACCOUNT = Account("default", 1)  # the top-level instance's account 1

pytestmark = pytest.mark.integration

FAST = """
[behaviour]
delivered_after_s = 0.05
read_after_s = 0.05
failed_after_s = 0.05
"""


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with running_sandbox(FAST) as process:
        yield process


@pytest.fixture()
def enqueuer() -> ListEnqueuer:
    return ListEnqueuer()


def _context(sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, **overrides: Any) -> Iterator[SendContext]:
    sandbox.reset()
    settings = example_settings(api_url=sandbox.base_url, database_url=f"sqlite:///{tmp_path}/tracking.sqlite", **overrides)
    with send_context(settings) as ctx:
        ctx.enqueuer = enqueuer
        yield ctx


@pytest.fixture()
def context(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> Iterator[SendContext]:
    yield from _context(sandbox, tmp_path, enqueuer)


def _deadline_routes(seconds: float) -> dict[str, Any]:
    """The example's routes with the reminders route's delivery deadline cut to ``seconds``."""
    routes: dict[str, Any] = example_settings(api_url="http://x").model_dump()["routes"]
    routes["reminders"]["delivery_deadline_s"] = seconds
    return routes


def _send(ctx: SendContext, request: dict[str, Any]) -> int:
    record = intake.accept(parse_request(request), sessions=ctx.sessions, settings=ctx.settings, enqueuer=ListEnqueuer())
    with ctx.sessions() as session:
        notification = store.find_notification_by_event(session, record.event_id)
        assert notification is not None
        notification_id = notification.id
    assert drive(ctx, notification_id)[-1].outcome is Outcome.ACCEPTED
    return notification_id


def _sent_message(ctx: SendContext, event_id: str, *, identifier: str, phone: str) -> int:
    """Hand over and send a reminder; its message's ID."""
    _send(ctx, reminder(event_id, identifier=identifier, phone=phone))
    message_id = intake.status(ctx.sessions, event_id).message_id
    assert message_id is not None
    return message_id


def _sandbox_status(sandbox: SandboxProcess, message_id: int, wanted: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        message = next(m for m in sandbox.messages() if m["id"] == message_id)
        if message["status"] in wanted:
            return message
        time.sleep(0.05)
    raise AssertionError(f"sandbox message {message_id} never reached {wanted}")


def _updated(message_id: int, status: str | None, external_error: str | None = None) -> EventSummary:
    return EventSummary(event="message_updated", message_id=message_id, status=status, external_error=external_error)


def test_outcomes_move_forward_only_and_apply_once(context: SendContext, sandbox: SandboxProcess,
                                                   enqueuer: ListEnqueuer) -> None:
    notification_id = _send(context, reminder("trk-1", identifier="trk-p1", phone="+15550400001"))
    record = intake.status(context.sessions, "trk-1")
    message_id = record.message_id
    assert message_id is not None
    assert apply_event(_updated(message_id, "delivered"), context, enqueuer) == "applied_delivered"
    assert apply_event(_updated(message_id, "delivered"), context, enqueuer) == "duplicate_status"
    assert apply_event(_updated(message_id, "sent"), context, enqueuer) == "stale"  # late, out of order
    assert intake.status(context.sessions, "trk-1").state == "delivered"
    assert apply_event(_updated(message_id, "read"), context, enqueuer) == "applied_read"
    assert apply_event(_updated(message_id, "failed", "131026: x"), context, enqueuer) == "stale"  # after read
    listed = _listed(sandbox)
    assert apply_event(_updated(message_id, None), context, enqueuer) == "settled"  # no status, nothing after read
    assert _listed(sandbox) == listed
    final = intake.status(context.sessions, "trk-1")
    assert final.state == "read"
    assert final.fallback_decision is None
    with context.sessions() as session:
        assert store.load_payload(session, notification_id) is None  # delivered: content forgotten
    assert apply_event(_updated(987654, "delivered"), context, enqueuer) == "ignored_not_ours"


def test_undeliverable_falls_back_exactly_once(context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer) -> None:
    # Given a recipient the platform cannot reach (the seed fails +1555010... with 131026)
    notification_id = _send(context, reminder("trk-fail", identifier="trk-p2", phone="+15550107002"))
    message_id = intake.status(context.sessions, "trk-fail").message_id
    assert message_id is not None
    failed = _sandbox_status(sandbox, message_id, {"failed"})
    event = _updated(message_id, "failed", failed["external_error"])
    decided = _decisions()
    # When the failure arrives, again and again
    outcomes = [apply_event(event, context, enqueuer) for _ in range(5)]
    # Then one decision: fall back, once; the copies change nothing, and it is counted once, as a fallback
    assert outcomes[0] == "fallback"
    assert set(outcomes[1:]) == {"duplicate_status"}
    assert _decisions() == {"fallback": decided["fallback"] + 1, "none": decided["none"]}
    assert enqueuer.queues == {notification_id: send_queue(DEFAULT_WORKSPACE_NAME, Priority.NORMAL)}  # its own lane
    with context.sessions.begin() as session:  # marked published with the decision: no sweep publishes it again
        now = context.clock()
        assert notification_id not in [row.id for row in worklists.due_for_enqueue(
            session, now=now, stale_before=now - timedelta(minutes=5), limit=100, send_queue_empty=True)]
    record = intake.status(context.sessions, "trk-fail")
    assert record.fallback_decision == "fallback"
    assert record.fallback_reason == "undeliverable (131026)"
    assert record.state == "falling_back"
    assert enqueuer.sent == [notification_id]
    # And the fallback goes out through the same send path, on SMS, once
    assert drive(context, notification_id)[-1].outcome is Outcome.ACCEPTED
    assert drive(context, notification_id)[-1].outcome is Outcome.SKIPPED
    record = intake.status(context.sessions, "trk-fail")
    assert [(a.number, a.route, a.state) for a in record.attempts][0] == (1, "reminders", "failed")
    assert record.attempts[1].route == "sms" and record.attempts[1].message_id is not None
    sms_messages = [m for m in sandbox.messages() if m["inbox_id"] == 2]
    assert len(sms_messages) == 1


def test_template_mismatch_is_recorded_as_no_fallback(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    # Given our registry says test_results_ready takes 2 parameters, the platform approved 1
    templates = [
        {"name": "test_results_ready", "language": "en", "category": "UTILITY", "body_params": 2},
    ]
    for ctx in _context(sandbox, tmp_path, enqueuer, templates=templates):
        request = reminder("trk-tpl", identifier="trk-p3", phone="+15550400003")
        request["template"] = {"name": "test_results_ready", "language": "en", "category": "UTILITY",
                               "params": {"1": "a", "2": "b"}}
        _send(ctx, request)
        message_id = intake.status(ctx.sessions, "trk-tpl").message_id
        assert message_id is not None
        failed = _sandbox_status(sandbox, message_id, {"failed"})
        assert failed["external_error"].startswith("132000")
        decided = _decisions()
        assert apply_event(_updated(message_id, "failed", failed["external_error"]), ctx, enqueuer) == "no_fallback"
        assert _decisions() == {"fallback": decided["fallback"], "none": decided["none"] + 1}
        record = intake.status(ctx.sessions, "trk-tpl")
        assert record.state == "failed"
        assert record.fallback_decision == "none"
        assert record.fallback_reason == "template_misconfigured (132000)"
        assert enqueuer.sent == []


def test_an_event_without_status_is_read_from_the_stored_conversation(
    context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer
) -> None:
    _send(context, reminder("trk-nostatus", identifier="trk-p4", phone="+15550400004"))
    record = intake.status(context.sessions, "trk-nostatus")
    assert record.message_id is not None
    _sandbox_status(sandbox, record.message_id, {"read"})
    # A stock payload: no status, and a conversation id that is NOT the display id
    event = EventSummary(event="message_updated", message_id=record.message_id, status=None,
                         conversation_display_id=999_999)
    assert apply_event(event, context, enqueuer) == "applied_read"
    assert intake.status(context.sessions, "trk-nostatus").state == "read"


def _update(message_id: int, digest: str, *, external_error: str | None = None) -> EventSummary:
    """A stock update of one of our messages: no status of its own; ``digest`` its body's."""
    return EventSummary(event="message_updated", message_id=message_id, message_type="outgoing",
                        external_error=external_error, body_digest=digest)


def test_a_message_s_first_status_less_update_is_read_at_once_and_the_next_one_waits(
    context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer
) -> None:
    # a recipient the workspace never confirms: the first read cannot find the message settled
    # (read) on a slow machine, which would leave nothing to wait for
    _send(context, reminder("trk-first", identifier="trk-p31", phone="+15550200031"))
    message_id = intake.status(context.sessions, "trk-first").message_id
    assert message_id is not None
    before = _listed(sandbox)
    # the first update of the message (whatever it announces): read at once, no wait
    assert apply_event(_update(message_id, "d-1"), context, enqueuer, received_at=context.clock()) in (
        "stale", "no_status", "applied_delivered", "applied_read")
    assert _listed(sandbox) == before + 1
    # the next one, received after that read: told to wait until the read's coalescing period ends
    with pytest.raises(Wait) as waited:
        apply_event(_update(message_id, "d-2"), context, enqueuer, received_at=context.clock())
    assert 0 < waited.value.delay_s <= context.settings.status_read_wait_s
    assert waited.value.reason  # the wait says why, where the delivery's retry shows it
    assert _listed(sandbox) == before + 1


def test_a_burst_of_status_less_updates_in_a_conversation_costs_one_read_after_the_first(
    context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer
) -> None:
    # given two reminders to one patient (one conversation) whom the workspace never confirms, so
    # that neither message is settled by the first read however slow the machine
    for n in (1, 2):
        _send(context, reminder(f"trk-burst-{n}", identifier="trk-p35", phone="+15550200035"))
    first, second = (intake.status(context.sessions, f"trk-burst-{n}").message_id for n in (1, 2))
    assert first is not None and second is not None
    before = _listed(sandbox)
    # when the first status-less update comes: read at once
    apply_event(_update(first, "a-1"), context, enqueuer, received_at=context.clock())
    # and a burst after it, of both messages: each told to wait for the same moment
    burst = [(first, "a-2"), (second, "b-1"), (second, "b-2"), (first, "a-3")]
    received = context.clock()
    waits = []
    for message_id, digest in burst:
        with pytest.raises(Wait) as waited:
            apply_event(_update(message_id, digest), context, enqueuer, received_at=received)
        waits.append(waited.value.delay_s)
    time.sleep(max(waits) + 0.05)
    for message_id, digest in burst:
        apply_event(_update(message_id, digest), context, enqueuer, received_at=received)
    # then the burst cost one read: the first of it read the conversation, which answered the other three
    assert _listed(sandbox) == before + 2


def test_a_delivery_told_to_wait_gives_its_try_back_and_is_never_set_aside_for_waiting(
    context: SendContext, enqueuer: ListEnqueuer
) -> None:
    _send(context, reminder("trk-waits", identifier="trk-p36", phone="+15550200036"))
    message_id = intake.status(context.sessions, "trk-waits").message_id
    assert message_id is not None
    [row] = _recorded(context, ("w-1", _update(message_id, "w-1").model_dump(mode="json")))
    with context.sessions.begin() as session:  # read just before it came: its read waits for the burst
        received = session.get(WebhookDelivery, row).received_at  # type: ignore[union-attr]
        store.note_read(session, context.settings.workspace_name, [message_id], at=received - timedelta(seconds=0.5))
    for _ in range(context.settings.delivery_max_tries + 2):  # more runs than a delivery has tries
        with pytest.raises(Wait):
            process_delivery(row, context, enqueuer)
    with context.sessions() as session:
        delivery = session.get(WebhookDelivery, row)
        assert delivery is not None
        assert (delivery.tries, delivery.processed_at, delivery.outcome) == (0, None, None)


def test_a_read_begun_the_moment_a_report_arrived_answers_it_without_a_wait(
    context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer
) -> None:
    message_id = _sent_message(context, "trk-same-moment", identifier="trk-p37", phone="+15550200037")
    received = context.clock()
    with context.sessions.begin() as session:  # a read begun at the very moment the report was received
        store.note_read(session, context.settings.workspace_name, [message_id], at=received)
    listed = _listed(sandbox)
    assert apply_event(_update(message_id, "s-1"), context, enqueuer, received_at=received) == "known_from_read"
    assert _listed(sandbox) == listed  # neither a read nor a wait: that read told what it announces


def test_a_report_the_store_missed_is_read_back_by_its_message_and_nothing_else_is(
    context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer
) -> None:
    # the receiver could not record the report (the store was away) and queued a read-back of its message
    message_id = _sent_message(context, "trk-missed", identifier="trk-p38", phone="+15550400038")
    _sandbox_status(sandbox, message_id, {"read"})
    assert outcomes.read_back_message(message_id, context, enqueuer) == "applied_read"
    assert intake.status(context.sessions, "trk-missed").state == "read"
    # one that failed: the read-back decides the fallback and publishes it, as its report would have
    failing = _send(context, reminder("trk-missed-fail", identifier="trk-p39", phone="+15550107039"))
    failed_id = intake.status(context.sessions, "trk-missed-fail").message_id
    assert failed_id is not None
    _sandbox_status(sandbox, failed_id, {"failed"})
    assert outcomes.read_back_message(failed_id, context, enqueuer) == "fallback"
    assert enqueuer.sent == [failing]
    listed = _listed(sandbox)
    assert outcomes.read_back_message(987_654, context, enqueuer) == "ignored_not_ours"  # no attempt names it
    assert outcomes.reconcile_attempt(987_654, context, enqueuer) == "ignored"  # no such attempt
    assert _listed(sandbox) == listed  # neither cost a read


def test_two_distinct_updates_without_a_failure_are_taken_for_delivery_though_the_workspace_says_sent(
    context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer
) -> None:
    # given a message the workspace keeps at "sent" (never confirmed), read once already
    _send(context, reminder("trk-overwritten", identifier="trk-p32", phone="+15550200032"))
    message_id = intake.status(context.sessions, "trk-overwritten").message_id
    assert message_id is not None
    with context.sessions.begin() as session:
        store.note_read(session, context.settings.workspace_name, [message_id], at=context.clock())
    later = context.clock() - timedelta(seconds=1)  # received before that read: it told what they announce
    # when its first update comes, and a copy of it (another delivery ID, the same body), and one with an error
    assert apply_event(_update(message_id, "d-1"), context, enqueuer, received_at=later) == "known_from_read"
    assert apply_event(_update(message_id, "d-1"), context, enqueuer, received_at=later) == "known_from_read"
    assert apply_event(_update(message_id, "d-e", external_error="131026: Message undeliverable"), context, enqueuer,
                       received_at=later) == "known_from_read"
    # then nothing is concluded: one update may be the provider's id, announced while sent
    assert intake.status(context.sessions, "trk-overwritten").state == "sent"
    # and a second, different update without an error: the message moved past sent
    assert apply_event(_update(message_id, "d-2"), context, enqueuer, received_at=later) == "delivered_by_events"
    record = intake.status(context.sessions, "trk-overwritten")
    assert (record.state, record.fallback_decision) == ("delivered", None)
    assert next(m for m in sandbox.messages() if m["id"] == message_id)["status"] == "sent"


def test_the_deadline_weighs_updates_still_waiting_for_a_consumer_and_does_not_fall_back(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    routes = _deadline_routes(0.2)
    for ctx in _context(sandbox, tmp_path, enqueuer, routes=routes):
        _send(ctx, reminder("trk-deadline-events", identifier="trk-p33", phone="+15550200033"))  # stays "sent"
        message_id = intake.status(ctx.sessions, "trk-deadline-events").message_id
        assert message_id is not None
        # two distinct updates received, none applied yet (a consumer's backlog), and a copy
        _recorded(ctx, *((f"ev-{n}", _update(message_id, digest).model_dump(mode="json"))
                         for n, digest in enumerate(("d-1", "d-2", "d-2"))))
        time.sleep(0.3)
        report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
        assert report.deadline_decisions == {"confirmed_by_events": 1}
        record = intake.status(ctx.sessions, "trk-deadline-events")
        assert (record.state, record.fallback_decision) == ("delivered", None)
        assert enqueuer.sent == []  # no fallback: the patient has the message


@pytest.mark.parametrize(("early", "word"), [
    ([("d-1", None), ("d-2", None)], "delivered_by_events"),  # two updates, no status of their own
    ([("d-1", "delivered")], "applied_delivered"),  # one that carried its status (conversation.messages[0])
])
def test_reports_that_came_before_the_send_was_recorded_are_weighed_by_the_next_read_back(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch,
    early: list[tuple[str, str | None]], word: str,
) -> None:
    """Reports that reached the consumer before the send path recorded the message were taken for
    another's (``ignored_not_ours``); a late "sent" has overwritten the workspace's status since.
    The read-back finds "sent": what was received says more, and is weighed (a fallback attempt has
    no deadline to do it)."""
    for ctx in _context(sandbox, tmp_path, enqueuer, reconcile_after_s=0.05):
        _send(ctx, reminder(f"trk-early-{word}", identifier=f"trk-p37-{word}", phone="+15550200037"))
        message_id = intake.status(ctx.sessions, f"trk-early-{word}").message_id
        assert message_id is not None
        rows = _recorded(ctx, *((f"early-{word}-{n}", {**_update(message_id, digest).model_dump(mode="json"),
                                                        "status": status})
                               for n, (digest, status) in enumerate(early)))
        with ctx.sessions.begin() as session:
            for row in rows:
                store.mark_delivery_processed(session, row, outcome="ignored_not_ours", now=ctx.clock())
        time.sleep(0.1)
        assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).reconciled == {word: 1}
        record = intake.status(ctx.sessions, f"trk-early-{word}")
        assert (record.state, record.fallback_decision) == ("delivered", None)


def test_the_deadline_falls_back_when_the_only_update_is_copied(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    routes = _deadline_routes(0.2)
    for ctx in _context(sandbox, tmp_path, enqueuer, routes=routes):
        notification_id = _send(ctx, reminder("trk-deadline-copy", identifier="trk-p34", phone="+15550200034"))
        message_id = intake.status(ctx.sessions, "trk-deadline-copy").message_id
        assert message_id is not None
        # the provider's id announced, delivered twice under two IDs: one update, not two
        _recorded(ctx, *((f"cp-{n}", _update(message_id, "d-1").model_dump(mode="json")) for n in range(2)))
        time.sleep(0.3)
        assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).deadline_decisions == {"fallback": 1}
        assert enqueuer.sent == [notification_id]


def test_reconciliation_brings_lost_webhooks_to_the_true_state(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    for ctx in _context(sandbox, tmp_path, enqueuer, reconcile_after_s=0.01):
        delivered = _send(ctx, reminder("trk-lost-ok", identifier="trk-p5", phone="+15550400005"))
        failing = _send(ctx, reminder("trk-lost-fail", identifier="trk-p6", phone="+15550107006"))
        for event_id in ("trk-lost-ok", "trk-lost-fail"):
            message_id = intake.status(ctx.sessions, event_id).message_id
            assert message_id is not None
            _sandbox_status(sandbox, message_id, {"read", "failed"})
        time.sleep(0.05)
        # No webhook at all; the sweep reads the messages back
        report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
        assert sum(report.reconciled.values()) >= 2
        assert intake.status(ctx.sessions, "trk-lost-ok").state == "read"
        lost_fail = intake.status(ctx.sessions, "trk-lost-fail")
        assert lost_fail.attempts[0].state == "failed"
        assert lost_fail.fallback_decision == "fallback"
        assert enqueuer.sent == [failing]
        assert delivered not in enqueuer.sent


def test_a_delivered_platform_message_whose_read_report_was_lost_is_read_back_once(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    # reconcile_after_s, the one read's delay after delivered, made short so the test need not wait a minute
    for ctx in _context(sandbox, tmp_path, enqueuer, reconcile_after_s=0.05):
        _send(ctx, reminder("trk-read", identifier="trk-p11", phone="+15550400011"))
        message_id = intake.status(ctx.sessions, "trk-read").message_id
        assert message_id is not None
        # the delivered webhook came; the read one was lost
        assert apply_event(_updated(message_id, "delivered"), ctx, enqueuer) == "applied_delivered"
        _sandbox_status(sandbox, message_id, {"read"})
        time.sleep(0.1)
        report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
        assert report.reconciled == {"applied_read": 1}
        assert intake.status(ctx.sessions, "trk-read").state == "read"
        # and a read attempt is settled: it is not read again
        time.sleep(0.1)
        assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).reconciled == {}


def _delivered_with_its_read_report_lost(ctx: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer,
                                        event_id: str, identifier: str, phone: str) -> None:
    """A reminder sent, its delivery applied, then read in the workspace with that report lost."""
    _send(ctx, reminder(event_id, identifier=identifier, phone=phone))
    message_id = intake.status(ctx.sessions, event_id).message_id
    assert message_id is not None
    assert apply_event(_updated(message_id, "delivered"), ctx, enqueuer) == "applied_delivered"
    _sandbox_status(sandbox, message_id, {"read"})


def test_the_one_read_back_of_a_delivered_message_that_fails_is_made_again(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    for ctx in _context(sandbox, tmp_path, enqueuer, reconcile_after_s=0.05):
        _delivered_with_its_read_report_lost(ctx, sandbox, enqueuer, "trk-read-again", "trk-p15", "+15550400015")
        sandbox.set_faults({"listMessages": {"server_error_share": 1.0}})
        try:
            time.sleep(0.1)
            assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).reconciled == {"unreadable": 1}
        finally:
            sandbox.set_faults({})
        time.sleep(0.1)
        assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).reconciled == {"applied_read": 1}


def test_a_read_back_whose_process_dies_before_its_outcome_is_made_again_after_the_hold(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    for ctx in _context(sandbox, tmp_path, enqueuer, reconcile_after_s=0.05):
        _delivered_with_its_read_report_lost(ctx, sandbox, enqueuer, "trk-read-dies", "trk-p16", "+15550400016")
        time.sleep(0.1)
        # the one read-back reads "read", and its process dies before it applies it
        clean_environment.setattr(outcomes, "apply_outcome", lambda *args, **kwargs: (_ for _ in ()).throw(
            RuntimeError("killed")))
        with pytest.raises(RuntimeError):
            tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
        clean_environment.undo()
        assert intake.status(ctx.sessions, "trk-read-dies").state == "delivered"
        # then, once the sweep's hold has passed, it is read again and the read applied
        real_clock = ctx.clock
        ctx.clock = lambda: real_clock() + timedelta(seconds=READ_HOLD_S + 1)
        assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).reconciled == {"applied_read": 1}
        assert intake.status(ctx.sessions, "trk-read-dies").state == "read"


def test_a_read_back_answers_every_message_of_ours_on_the_page_not_only_the_due_one(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    for ctx in _context(sandbox, tmp_path, enqueuer, reconcile_after_s=0.05):
        # two reminders to one patient; the first's delivery reported (its one read-back a minute off), the second's not
        for n in (1, 2):
            _send(ctx, reminder(f"trk-page-{n}", identifier="trk-p17", phone="+15550400017"))
        first, second = (intake.status(ctx.sessions, f"trk-page-{n}").message_id for n in (1, 2))
        assert first is not None and second is not None
        with ctx.sessions.begin() as session:  # the first's read-back is far off; the second's is due
            assert apply_event(_updated(first, "delivered"), ctx, enqueuer) == "applied_delivered"
            attempt = store.attempt_by_message(session, ctx.settings.workspace_name, first)
            assert attempt is not None
            store.schedule_read(session, attempt.id, at=ctx.clock() + timedelta(hours=1))
        for message_id in (first, second):
            _sandbox_status(sandbox, message_id, {"read"})
        time.sleep(0.1)
        assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).reconciled == {"applied_read": 1}
        # the read for the second answered the first too
        assert [intake.status(ctx.sessions, f"trk-page-{n}").state for n in (1, 2)] == ["read", "read"]


def test_a_delivered_message_is_read_back_once_at_most_and_a_delivered_sms_never(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    for ctx in _context(sandbox, tmp_path, enqueuer, reconcile_after_s=0.05):
        # a platform reminder whose recipient never reads it, and an SMS (whose channel never reports read)
        _send(ctx, reminder("trk-unread", identifier="trk-p13", phone="+15550200013"))  # never confirmed on WhatsApp
        sms = reminder("trk-sms", identifier="trk-p14", phone="+15550400014", route="sms")
        del sms["template"]  # free text: the only kind off the platform
        _send(ctx, sms)
        unread, texted = (intake.status(ctx.sessions, event).message_id for event in ("trk-unread", "trk-sms"))
        assert unread is not None and texted is not None
        _sandbox_status(sandbox, texted, {"delivered"})
        assert apply_event(_updated(unread, "delivered"), ctx, enqueuer) == "applied_delivered"  # as reported
        assert apply_event(_updated(texted, "delivered"), ctx, enqueuer) == "applied_delivered"
        reads = []
        for _ in range(5):  # sweeps over many times the read-back's delay
            time.sleep(0.1)
            before = sandbox.stats()["calls"].get("listMessages", 0)
            tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
            reads.append(sandbox.stats()["calls"].get("listMessages", 0) - before)
        # then the platform message was read back once (a lost read report), the SMS never
        assert reads == [1, 0, 0, 0, 0]
        assert [intake.status(ctx.sessions, event).state for event in ("trk-unread", "trk-sms")] == ["delivered",
                                                                                                    "delivered"]
        # and a read that comes later, by its webhook, is still recorded: read-backs ended, webhooks did not
        assert apply_event(_updated(unread, "read"), ctx, enqueuer) == "applied_read"
        assert intake.status(ctx.sessions, "trk-unread").state == "read"


def test_an_attempt_whose_fallback_was_decided_is_not_read_back_again(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    routes = _deadline_routes(0.2)
    for ctx in _context(sandbox, tmp_path, enqueuer, routes=routes, reconcile_after_s=0.01):
        _send(ctx, reminder("trk-decided", identifier="trk-p12", phone="+15550207012"))  # stays "sent"
        time.sleep(0.3)
        assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).deadline_decisions == {"fallback": 1}
        reads_before = sandbox.stats()["calls"].get("listMessages", 0)
        time.sleep(0.05)
        report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
        assert report.reconciled == {}  # the first attempt's fallback is decided: no more reads of it
        assert sandbox.stats()["calls"].get("listMessages", 0) == reads_before


def test_an_unconfirmed_attempt_gets_the_deadline_decision(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    routes = _deadline_routes(0.2)
    for ctx in _context(sandbox, tmp_path, enqueuer, routes=routes, reconcile_after_s=0.01):
        # The seed leaves +1555020... at "sent" forever
        notification_id = _send(ctx, reminder("trk-silent", identifier="trk-p7", phone="+15550207007"))
        time.sleep(0.3)
        report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
        assert report.deadline_decisions == {"fallback": 1}
        record = intake.status(ctx.sessions, "trk-silent")
        assert record.attempts[0].state == "sent"  # reconciliation confirmed it is still only sent
        assert record.fallback_decision == "fallback"
        assert record.fallback_reason == "not delivered by the deadline"
        assert enqueuer.sent == [notification_id]
        assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).deadline_decisions == {}


def test_the_deadline_reads_the_message_back_before_it_decides(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    routes = _deadline_routes(0.2)
    for ctx in _context(sandbox, tmp_path, enqueuer, routes=routes):  # read-backs at their default timing
        assert ctx.settings.reconcile_after_s > 0.2  # no scheduled read comes before this deadline
        _send(ctx, reminder("trk-deadline-read", identifier="trk-p21", phone="+15550400021"))
        message_id = intake.status(ctx.sessions, "trk-deadline-read").message_id
        assert message_id is not None
        _sandbox_status(sandbox, message_id, {"read"})  # it arrived; every report of it was lost
        time.sleep(0.3)
        report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
        assert report.reconciled == {}
        assert report.deadline_decisions == {"confirmed_by_read": 1}
        record = intake.status(ctx.sessions, "trk-deadline-read")
        assert (record.state, record.fallback_decision) == ("read", None)
        assert enqueuer.sent == []


def test_a_deadline_whose_read_back_fails_is_put_off_for_a_bounded_time(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    routes = _deadline_routes(0.2)
    for ctx in _context(sandbox, tmp_path, enqueuer, routes=routes):
        notification_id = _send(ctx, reminder("trk-deadline-unread", identifier="trk-p22", phone="+15550207022"))
        time.sleep(0.3)
        sandbox.set_faults({"listMessages": {"server_error_share": 1.0}})
        try:
            report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
            assert report.deadline_decisions == {"put_off_unreadable": 1}
            assert intake.status(ctx.sessions, "trk-deadline-unread").fallback_decision is None
            # reconcile_max_interval_s past the deadline, it decides on what it knows
            real_clock = ctx.clock
            ctx.clock = lambda: real_clock() + timedelta(seconds=ctx.settings.reconcile_max_interval_s + 1)
            report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
        finally:
            sandbox.set_faults({})
        assert report.deadline_decisions == {"fallback": 1}
        assert intake.status(ctx.sessions, "trk-deadline-unread").fallback_reason == "not delivered by the deadline"
        assert enqueuer.sent == [notification_id]


def test_a_failure_whose_consumer_died_before_deciding_is_decided_by_its_redelivery(
        context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer) -> None:
    class Killed(BaseException):
        """The consumer's process died here: no code of ours catches a BaseException."""

    # Given a consumer that recorded a 131026 failure and died before the fallback decision
    notification_id = _send(context, reminder("trk-owed", identifier="trk-p24", phone="+15550107024"))
    message_id = intake.status(context.sessions, "trk-owed").message_id
    assert message_id is not None
    failed = _sandbox_status(sandbox, message_id, {"failed"})
    event = _updated(message_id, "failed", failed["external_error"])

    def dies_once_the_failure_is_committed(point: str, in_transaction: bool) -> None:
        if point == "after commit" and intake.status(context.sessions, "trk-owed").attempts[0].state == "failed":
            raise Killed(point)

    previous = faults.install(dies_once_the_failure_is_committed)
    try:
        with pytest.raises(Killed):
            apply_event(event, context, enqueuer)
    finally:
        faults.install(previous)
    assert intake.status(context.sessions, "trk-owed").fallback_decision is None
    # When the broker delivers the same event again
    outcome = apply_event(event, context, enqueuer)
    # Then the redelivery makes the owed decision, with the failure's reason, and publishes the fallback
    assert outcome == "owed_fallback"
    record = intake.status(context.sessions, "trk-owed")
    assert (record.fallback_decision, record.fallback_reason) == ("fallback", "undeliverable (131026)")
    assert enqueuer.sent == [notification_id]
    assert apply_event(event, context, enqueuer) == "duplicate_status"  # nothing is owed any more


def test_a_run_that_finds_its_decision_owed_makes_that_one_and_no_other(
        context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer) -> None:
    class Killed(BaseException):
        """The consumer's process died here: no code of ours catches a BaseException."""

    # Given two notifications whose failures were recorded by consumers that died before deciding
    owed = {}
    for n in (1, 2):
        event_id = f"trk-owed-{n}"
        owed[event_id] = _send(context, reminder(event_id, identifier=f"trk-p4{n}", phone=f"+155501070{40 + n}"))
        message_id = intake.status(context.sessions, event_id).message_id
        assert message_id is not None
        failed = _sandbox_status(sandbox, message_id, {"failed"})

        def dies_once_the_failure_is_committed(point: str, in_transaction: bool, event_id: str = event_id) -> None:
            if point == "after commit" and intake.status(context.sessions, event_id).attempts[0].state == "failed":
                raise Killed(point)

        previous = faults.install(dies_once_the_failure_is_committed)
        try:
            with pytest.raises(Killed):
                apply_event(_updated(message_id, "failed", failed["external_error"]), context, enqueuer)
        finally:
            faults.install(previous)
    # When the second one's run makes its owed decision
    assert outcomes.finish_owed_decision(owed["trk-owed-2"], context, enqueuer) == "fallback"
    # Then that notification is decided and its fallback published; the first is left to its own repair
    assert intake.status(context.sessions, "trk-owed-2").fallback_decision == "fallback"
    assert intake.status(context.sessions, "trk-owed-1").fallback_decision is None
    assert enqueuer.sent == [owed["trk-owed-2"]]
    assert outcomes.finish_owed_decision(owed["trk-owed-2"], context, enqueuer) is None  # nothing owed any more


def test_a_failure_recorded_while_the_deadline_reads_back_decides_with_its_own_reason(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    """A chaos run found this: the consumer, busy or restarted, took a 131026 report late; it
    recorded the failure while the tracking sweep read the message back at the deadline, and the
    sweep's decision said "not delivered by the deadline" for a message the platform had failed."""
    routes = _deadline_routes(0.2)
    for ctx in _context(sandbox, tmp_path, enqueuer, routes=routes):
        notification_id = _send(ctx, reminder("trk-deadline-failed", identifier="trk-p23", phone="+15550107023"))
        message_id = intake.status(ctx.sessions, "trk-deadline-failed").message_id
        assert message_id is not None
        _sandbox_status(sandbox, message_id, {"failed"})  # the platform failed it; its report comes late
        time.sleep(0.3)
        read_back = outcomes.reconcile_attempt

        def consumer_records_the_failure_meanwhile(attempt_id: int, ctx_: SendContext, enqueuer_: Any) -> str:
            with ctx.sessions.begin() as session:  # the consumer's first transaction; it dies before deciding
                attempt = session.get(Attempt, attempt_id)
                assert attempt is not None
                assert moves.record_outcome(session, notification_id=attempt.notification_id, attempt_id=attempt.id,
                                            attempt_number=attempt.number, current=AttemptState(attempt.state),
                                            new=AttemptState.FAILED, external_error="131026: Message undeliverable",
                                            now=ctx.clock())
            return read_back(attempt_id, ctx_, enqueuer_)

        outcomes.reconcile_attempt = consumer_records_the_failure_meanwhile  # type: ignore[assignment]
        try:
            report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
        finally:
            outcomes.reconcile_attempt = read_back  # type: ignore[assignment]
        assert "fallback" not in report.deadline_decisions
        assert intake.status(ctx.sessions, "trk-deadline-failed").fallback_decision is None
        # The failure's own decision: the consumer died before it, so the sweep's repair makes it
        real_clock = ctx.clock
        ctx.clock = lambda: real_clock() + timedelta(seconds=60)
        assert tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome).repaired == 1
        record = intake.status(ctx.sessions, "trk-deadline-failed")
        assert (record.fallback_decision, record.fallback_reason) == ("fallback", "undeliverable (131026)")
        assert enqueuer.sent == [notification_id]


def test_an_incoming_message_opens_the_window_for_free_text(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    for ctx in _context(sandbox, tmp_path, enqueuer):
        _send(ctx, reminder("trk-win-1", identifier="trk-p8", phone="+15550400008"))
        first = intake.status(ctx.sessions, "trk-win-1")
        assert first.attempts[0].message_id is not None
        contact_id = next(m for m in sandbox.messages() if m["id"] == first.message_id)["contact_id"]
        # The customer writes in (as the receiver summarises message_created, incoming)
        incoming = EventSummary(event="message_created", message_type="incoming", message_id=5,
                                contact_id=contact_id, inbox_id=1, created_at=ctx.clock())
        outcome = apply_event(incoming, ctx, enqueuer)
        assert outcome == "window_opened"
        _send(ctx, reminder("trk-win-2", identifier="trk-p8", phone="+15550400008"))
        second = intake.status(ctx.sessions, "trk-win-2")
        sent = next(m for m in sandbox.messages() if m["id"] == second.message_id)
        assert sent["template_name"] in (None, "")  # inside the window: free text
        assert next(m for m in sandbox.messages() if m["id"] == first.message_id)["template_name"] == "appointment_reminder"
        # A late report of an older incoming message never moves the window back
        with ctx.sessions.begin() as session:
            store.open_service_window(session, account=ACCOUNT, contact_id=contact_id, inbox_id=1,
                                      at=ctx.clock() - timedelta(hours=30))
        with ctx.sessions() as session:
            assert window_open(store.last_incoming_at(session, account=ACCOUNT, contact_id=contact_id, inbox_id=1), now=ctx.clock())
            # and 24 hours after the last incoming message it is closed
            later = ctx.clock() + timedelta(hours=24, seconds=1)
            assert not window_open(store.last_incoming_at(session, account=ACCOUNT, contact_id=contact_id, inbox_id=1), now=later)


def test_a_recovered_send_whose_message_already_failed_still_gets_its_decision(
    context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer
) -> None:
    # Found by the chaos suite. Given the response to createMessage is lost, and the platform
    # fails the message (131026) before we know its ID
    record = intake.accept(parse_request(reminder("trk-lost-then-failed", identifier="trk-p9", phone="+15550107009")),
                           sessions=context.sessions, settings=context.settings, enqueuer=ListEnqueuer())
    with context.sessions() as session:
        notification = store.find_notification_by_event(session, record.event_id)
        assert notification is not None
        notification_id = notification.id
    sandbox.set_faults({"createMessage": {"drop_response_share": 1.0}})
    from dispatcher.sending.send import send_notification

    assert send_notification(notification_id, context).outcome is Outcome.RETRY
    sandbox.set_faults({})
    [message] = [m for m in sandbox.messages() if (m.get("content") or "").startswith("Reminder trk-lost-then-failed:")]
    failed = _sandbox_status(sandbox, message["id"], {"failed"})
    # its failure webhook arrives while the message is not known to be ours
    assert apply_event(_updated(message["id"], "failed", failed["external_error"]), context, enqueuer) == "ignored_not_ours"
    # When the next run adopts the message, already failed
    assert send_notification(notification_id, context).outcome is Outcome.ADOPTED
    # Then the failure is applied and the single decision made: fall back to SMS
    record = intake.status(context.sessions, "trk-lost-then-failed")
    assert record.attempts[0].state == "failed"
    assert record.fallback_decision == "fallback" and record.fallback_reason == "undeliverable (131026)"
    assert enqueuer.sent == [notification_id]


def test_a_failure_left_undecided_by_a_killed_consumer_is_decided_by_the_sweep(
    context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer
) -> None:
    # Found by the chaos suite. Given a consumer recorded the failure and was killed before deciding
    notification_id = _send(context, reminder("trk-killed", identifier="trk-p10", phone="+15550107010"))
    with context.sessions.begin() as session:
        attempt = store.attempts_of(session, notification_id)[0]
        assert moves.record_outcome(session, notification_id=notification_id, attempt_id=attempt.id, attempt_number=1,
                                    current=AttemptState(attempt.state), new=AttemptState.FAILED,
                                    external_error="131026: Message undeliverable",
                                    now=context.clock() - timedelta(minutes=5))
    assert intake.status(context.sessions, "trk-killed").fallback_decision is None
    # When the tracking sweep runs
    report = tracking_sweep(context, enqueuer, enqueuer.enqueue_outcome)
    # Then the decision is made, once
    assert report.repaired == 1
    record = intake.status(context.sessions, "trk-killed")
    assert record.fallback_decision == "fallback" and record.fallback_reason == "undeliverable (131026)"
    assert tracking_sweep(context, enqueuer, enqueuer.enqueue_outcome).repaired == 0
    assert enqueuer.sent == [notification_id]


def test_a_delivery_that_cannot_be_applied_is_set_aside_after_its_tries_and_the_others_go_on(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    for ctx in _context(sandbox, tmp_path, enqueuer, delivery_max_tries=3, status_read_wait_s=0):
        _send(ctx, reminder("trk-poison", identifier="trk-p13", phone="+15550400013"))
        message_id = intake.status(ctx.sessions, "trk-poison").message_id
        assert message_id is not None
        # given the stored conversation is gone from the workspace: reading the status fails every time
        with ctx.sessions.begin() as session:
            session.execute(sa.update(Attempt).where(Attempt.message_id == message_id).values(conversation_id=987654))
        poison, good = record_deliveries(ctx.sessions, [
            NewDelivery("poison-1", "message_updated", {"event": "message_updated", "message_id": message_id},
                        ctx.clock()),
            NewDelivery("good-1", "message_created", {"event": "message_created", "message_id": 424242}, ctx.clock()),
        ])
        assert poison is not None and good is not None
        for _ in range(3):  # when the consumer tries it, it fails, keeping the reason
            with pytest.raises(NotFound):
                process_delivery(poison, ctx, enqueuer)
        assert process_delivery(good, ctx, enqueuer) == "ignored_not_ours"  # the others go on
        # then past its tries it is set aside, with why, and never tried again
        assert process_delivery(poison, ctx, enqueuer) == "set_aside"
        assert process_delivery(poison, ctx, enqueuer) == "already_processed"
        with ctx.sessions() as session:
            row = session.get(WebhookDelivery, poison)
            assert row is not None
            assert (row.outcome, row.tries, row.last_error) == ("set_aside", 4, "NotFound")

        # and an operator sees it (IDs and the error's class), in a metric too, and acts on it
        def dispatcher_cli(*args: str) -> str:
            env = {"DISPATCHER_CONFIG": str(EXAMPLE_CONFIG), "DISPATCHER_DATABASE_URL": ctx.settings.database_url}
            result = CliRunner().invoke(cli, list(args), env=env)
            assert result.exit_code == 0, result.output
            return result.output

        listed = dispatcher_cli("deliveries", "list")
        assert f"{poison:>8}" in listed and "poison-1" in listed and "NotFound" in listed
        assert "dispatcher_webhook_deliveries_set_aside 1.0" in render(NotificationStates(ctx.sessions)).decode()
        assert dispatcher_cli("deliveries", "retry", str(poison)) == f"retried: {poison}\n"
        with ctx.sessions.begin() as session:  # the tracking sweep's next pass publishes it again
            quiet = ctx.clock() + timedelta(seconds=31)
            assert store.take_lost_deliveries(session, quiet_since=quiet, now=quiet, limit=10) == [poison]
        for _ in range(ctx.settings.delivery_max_tries):  # the cause is still there: set aside again after fresh tries
            with pytest.raises(NotFound):
                process_delivery(poison, ctx, enqueuer)
        assert process_delivery(poison, ctx, enqueuer) == "set_aside"
        assert dispatcher_cli("deliveries", "drop", str(poison)) == f"dropped: {poison}\n"
        assert dispatcher_cli("deliveries", "list") == "no delivery is set aside\n"
        assert "dispatcher_webhook_deliveries_set_aside 0.0" in render(NotificationStates(ctx.sessions)).decode()
        refused = CliRunner().invoke(cli, ["deliveries", "retry", str(poison)],
                                     env={"DISPATCHER_CONFIG": str(EXAMPLE_CONFIG),
                                          "DISPATCHER_DATABASE_URL": ctx.settings.database_url})
        assert refused.exit_code == 1 and "not set aside" in refused.output


def test_a_stop_reply_waits_for_a_workspace_that_is_away_instead_of_being_set_aside(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    # The simulation's outage world found it: a STOP needs the inbox list (routes named by their
    # inbox), and during an outage its delivery ran out of tries, was set aside, and the opt-out was lost.
    stop = {"event": "message_created", "message_id": 900001, "message_type": "incoming", "inbox_id": 2,
            "reply_keyword": normalise("STOP"), "sender_keys": ["key-of-the-sender"]}
    for ctx in _context(sandbox, tmp_path, enqueuer, delivery_max_tries=2, api_token="a-token-the-workspace-refuses"):
        (row_id,) = record_deliveries(ctx.sessions, [NewDelivery("stop-1", "message_created", stop, ctx.clock())])
        assert row_id is not None
        for _ in range(ctx.settings.delivery_max_tries + 3):  # past its tries: every run failed for the workspace
            with pytest.raises(Unauthorized):
                process_delivery(row_id, ctx, enqueuer)
        with ctx.sessions() as session:
            row = session.get(WebhookDelivery, row_id)
            assert row is not None
            assert (row.processed_at, row.tries, row.last_error) == (None, 0, "Unauthorized")  # waiting, and why
    for ctx in _context(sandbox, tmp_path, enqueuer, delivery_max_tries=2):  # the token is right again
        assert process_delivery(row_id, ctx, enqueuer) == "opted_out"
        with ctx.sessions() as session:
            suppressed = session.execute(sa.select(Suppression.recipient_key, Suppression.channel)).all()
        assert [tuple(row) for row in suppressed] == [("key-of-the-sender", "sms")]


def test_a_lost_delivery_is_published_again_at_most_once_per_grace_period(
    context: SendContext, enqueuer: ListEnqueuer
) -> None:
    # given 100 recorded deliveries whose tasks were lost, and consumers that stay down
    received = context.clock()
    rows = record_deliveries(context.sessions, [
        NewDelivery(f"lost-{n}", "message_created", {"event": "message_created", "message_id": 500000 + n}, received)
        for n in range(100)
    ])
    published: list[int] = []
    real_clock = context.clock

    def sweep_at(seconds: float) -> int:
        context.clock = lambda: received + timedelta(seconds=seconds)
        try:
            return tracking_sweep(context, enqueuer, published.append).republished
        finally:
            context.clock = real_clock

    # when the sweep runs every 5 s for 100 s
    counts = [sweep_at(seconds) for seconds in range(0, 101, 5)]
    # then each delivery went to the queue once per 30 s of silence, not once per pass
    assert counts[:7] == [0, 0, 0, 0, 0, 0, 0]  # within the first 30 s their own tasks may still run
    assert sum(counts) == len(published) == 200  # at 35 s and at 70 s (once per pass, it would be 1,400)
    assert counts[7] == counts[14] == 100
    assert sorted(set(published)) == sorted(row for row in rows if row is not None)


def test_while_the_consumers_are_stopped_each_delivery_keeps_one_task_in_the_queue(
    context: SendContext, enqueuer: ListEnqueuer
) -> None:
    # given 100 recorded deliveries whose tasks wait in the outcomes queue (the consumers are
    # stopped), and 3 more whose consumer took them and died before finishing
    received = context.clock()
    rows = [row for row in record_deliveries(context.sessions, [
        NewDelivery(f"waiting-{n}", "message_created", {"event": "message_created", "message_id": 600000 + n}, received)
        for n in range(103)]) if row is not None]
    died = rows[100:]
    with context.sessions.begin() as session:
        store.start_delivery_runs(session, died)
    enqueuer.outcome_depth = 100
    published: list[int] = []
    real_clock = context.clock

    def sweep_at(seconds: float) -> int:
        context.clock = lambda: received + timedelta(seconds=seconds)
        try:
            return tracking_sweep(context, enqueuer, published.append,
                                  outcomes_waiting=enqueuer.outcome_queue_depth).republished
        finally:
            context.clock = real_clock

    # when the sweep runs every 5 s for two minutes while they stay stopped
    counts = [sweep_at(seconds) for seconds in range(0, 121, 5)]
    # then only the 3 whose task died go to the queue again, once each: the others' tasks are there
    assert sum(counts) == len(published) == 3 and sorted(published) == sorted(died)
    # and once the queue is empty (their tasks were lost after all), every one goes, once per grace
    # period (a sweep takes 100 at most: the rest at the next)
    enqueuer.outcome_depth = 0
    assert [sweep_at(160), sweep_at(165), sweep_at(170)] == [100, 3, 0]


SHORT_WINDOW = FAST + "service_window_s = 0.3\n"  # the platform's window closes long before ours


def test_131047_on_free_text_resends_the_template_once_on_the_same_route(
    tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    with running_sandbox(SHORT_WINDOW) as platform:
        for ctx in _context(platform, tmp_path, enqueuer):
            # given a patient who wrote in (our window is open; the platform's has closed again)
            _send(ctx, reminder("trk-w-0", identifier="trk-p14", phone="+15550400014"))
            first = intake.status(ctx.sessions, "trk-w-0")
            contact_id = next(m for m in platform.messages() if m["id"] == first.message_id)["contact_id"]
            incoming = EventSummary(event="message_created", message_type="incoming", message_id=9,
                                    contact_id=contact_id, inbox_id=1, created_at=ctx.clock())
            assert apply_event(incoming, ctx, enqueuer) == "window_opened"
            time.sleep(0.4)
            # when the next notification goes out as free text and the platform fails it with 131047
            notification_id = _send(ctx, reminder("trk-w-1", identifier="trk-p14", phone="+15550400014"))
            record = intake.status(ctx.sessions, "trk-w-1")
            failed = _sandbox_status(platform, record.message_id, {"failed"})
            assert failed["external_error"].startswith("131047") and failed["template_name"] is None
            outcome = apply_event(_updated(record.message_id, "failed", failed["external_error"]), ctx, enqueuer)
            # then it is sent again once, on the same route, as the approved template: a new attempt
            assert outcome == "resend_as_template" and enqueuer.sent == [notification_id]
            assert intake.status(ctx.sessions, "trk-w-1").state == "sending"
            drive(ctx, notification_id)
            record = intake.status(ctx.sessions, "trk-w-1")
            assert [(a.number, a.route, a.purpose) for a in record.attempts] == [
                (1, "reminders", "first"), (2, "reminders", "template")]
            resent = next(m for m in platform.messages() if m["id"] == record.message_id)
            assert resent["template_name"] == "appointment_reminder" and resent["inbox_id"] == 1
            assert record.fallback_decision is None and record.state in ("sent", "delivered", "read")
            # and a 131047 on the template attempt never resends again: the normal rules decide, once
            assert apply_event(_updated(record.message_id, "failed", "131047: Re-engagement message"),
                               ctx, enqueuer) == "no_fallback"
            ended = intake.status(ctx.sessions, "trk-w-1")
            assert (ended.state, ended.error_kind) == ("failed", "external_error")
            assert len([m for m in platform.messages() if m["conversation_id"] == resent["conversation_id"]]) == 3


def _decisions() -> dict[str, float]:
    """This process's ``dispatcher_fallback_decisions_total``, by decision."""
    return {decision: REGISTRY.get_sample_value("dispatcher_fallback_decisions_total", {"decision": decision}) or 0.0
            for decision in ("fallback", "none")}


def _listed(sandbox: SandboxProcess) -> int:
    return int(sandbox.stats()["calls"].get("listMessages", 0))


def _sweep_once_read(ctx: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer,
                     message_ids: list[int | None]) -> tuple[Any, int]:
    """Once the workspace has every message read and each is due for its read-back, one tracking
    sweep: its report, and the message lists it read."""
    for message_id in message_ids:
        assert message_id is not None
        _sandbox_status(sandbox, message_id, {"read"})
    time.sleep(0.05)  # past reconcile_after_s: each is due
    before = _listed(sandbox)
    report = tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome)
    return report, _listed(sandbox) - before


def test_reconciliation_reads_a_conversation_once_for_all_its_due_attempts(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    for ctx in _context(sandbox, tmp_path, enqueuer, reconcile_after_s=0.01):
        for number in range(3):  # three reminders to one patient: one conversation
            _send(ctx, reminder(f"trk-batch-{number}", identifier="trk-p40", phone="+15550400040"))
        message_ids = [intake.status(ctx.sessions, f"trk-batch-{number}").message_id for number in range(3)]
        report, reads = _sweep_once_read(ctx, sandbox, enqueuer, message_ids)
        assert report.reconciled == {"applied_read": 3}
        assert reads == 1


def test_reconciliation_reads_an_attempt_older_than_its_conversation_s_latest_page_on_its_own(
    sandbox: SandboxProcess, tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    for ctx in _context(sandbox, tmp_path, enqueuer, reconcile_after_s=0.01):
        # two reminders to one patient with 20 of the patient's messages between them: the latest
        # page of the conversation (20 messages) no longer lists the first reminder
        first = _sent_message(ctx, "trk-old-page-1", identifier="trk-p45", phone="+15550400045")
        conversation_id = next(m for m in sandbox.messages() if m["id"] == first)["conversation_id"]
        for number in range(20):
            sandbox.incoming(conversation_id=conversation_id, content=f"message {number}")
        second = _sent_message(ctx, "trk-old-page-2", identifier="trk-p45", phone="+15550400045")
        # the sweep reads the latest page for both, then only the page ending with the first reminder
        report, reads = _sweep_once_read(ctx, sandbox, enqueuer, [first, second])
        assert report.reconciled == {"applied_read": 2}
        assert reads == 2
        assert [intake.status(ctx.sessions, f"trk-old-page-{n}").state for n in (1, 2)] == ["read", "read"]


def test_two_sweeps_at_once_read_each_attempt_back_once(
    sandbox: SandboxProcess, fresh_postgres_url: str, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch
) -> None:
    import threading

    sandbox.reset()
    settings = example_settings(api_url=sandbox.base_url, database_url=fresh_postgres_url, reconcile_after_s=0.01)
    with send_context(settings) as first, send_context(settings) as second:
        for person in range(4):
            for number in range(2):
                _send(first, reminder(f"trk-two-{person}-{number}", identifier=f"trk-p5{person}",
                                      phone=f"+155504005{person}0"))
        for person in range(4):
            for number in range(2):
                message_id = intake.status(first.sessions, f"trk-two-{person}-{number}").message_id
                assert message_id is not None
                _sandbox_status(sandbox, message_id, {"read"})
        time.sleep(0.05)
        start = threading.Barrier(2)
        reports: list[Any] = []

        def sweep(ctx: SendContext) -> None:
            start.wait()
            reports.append(tracking_sweep(ctx, enqueuer, enqueuer.enqueue_outcome))

        threads = [threading.Thread(target=sweep, args=(ctx,)) for ctx in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(reports) == 2
        assert sum(sum(report.reconciled.values()) for report in reports) == 8  # each attempt once, none twice
        assert {intake.status(first.sessions, f"trk-two-{p}-{n}").state for p in range(4) for n in range(2)} == {"read"}


def test_a_provider_s_error_is_kept_without_the_number_it_quotes(context: SendContext, enqueuer: ListEnqueuer) -> None:
    # Given a sent SMS whose failure text names the recipient's number (an outcome straight from
    # the workspace's answer: recovery's adopted message or a read-back, as well as a webhook)
    _send(context, reminder("trk-quoted", identifier="trk-pq", phone="+15550400002", route="sms"))
    message_id = intake.status(context.sessions, "trk-quoted").message_id
    assert message_id is not None
    quoted = "21211: The 'To' number +1 555 040 0002 is not a valid phone number"
    apply_event(_updated(message_id, "failed", quoted), context, enqueuer)
    record = intake.status(context.sessions, "trk-quoted")
    kept = " ".join(filter(None, [record.error_detail, record.fallback_reason,
                                  *(attempt.error_detail for attempt in record.attempts)]))
    assert "21211" in kept and "[number]" in kept and "555 040 0002" not in kept and "0400002" not in kept


# -- several deliveries in one consumer task (the receiver's group commit) ---------------------------


def _recorded(ctx: SendContext, *summaries: tuple[str, dict[str, Any]]) -> list[int]:
    row_ids = record_deliveries(ctx.sessions, [NewDelivery(delivery_id, str(summary["event"]), summary, ctx.clock())
                                              for delivery_id, summary in summaries])
    assert all(row_id is not None for row_id in row_ids)
    return [row_id for row_id in row_ids if row_id is not None]


def _commits_during(ctx: SendContext) -> tuple[list[int], Any]:
    engine = ctx.sessions.kw["bind"]
    commits: list[int] = []

    def count(*_: object) -> None:
        commits.append(1)

    sa.event.listen(engine, "commit", count)
    return commits, lambda: sa.event.remove(engine, "commit", count)


def test_deliveries_with_a_status_are_applied_in_one_transaction(context: SendContext, enqueuer: ListEnqueuer) -> None:
    ids = [_send(context, reminder(f"trk-b{n}", identifier=f"trk-b{n}", phone=f"+1555040090{n}")) for n in range(6)]
    messages = [intake.status(context.sessions, f"trk-b{n}").message_id for n in range(6)]
    rows = _recorded(context, *((f"b-{n}", {"event": "message_updated", "message_id": message, "status": "delivered"})
                                for n, message in enumerate(messages)))
    commits, stop = _commits_during(context)
    try:
        result = process_deliveries(rows, context, enqueuer)
    finally:
        stop()
    assert result.words == {"applied_delivered": 6} and result.waiting == []
    assert len(commits) == 2  # the runs counted, then every outcome with its delivery marked: not 2 per delivery
    assert {intake.status(context.sessions, f"trk-b{n}").state for n in range(6)} == {"delivered"}
    with context.sessions() as session:
        marked = session.execute(sa.select(WebhookDelivery.outcome, WebhookDelivery.tries)
                                 .where(WebhookDelivery.id.in_(rows))).all()
        assert {tuple(row) for row in marked} == {("applied_delivered", 1)}
        assert all(store.load_payload(session, notification_id) is None for notification_id in ids)
    assert process_deliveries(rows, context, enqueuer).words == {"already_processed": 6}  # a redelivered task


def _statements_during(ctx: SendContext) -> tuple[list[str], Any]:
    engine = ctx.sessions.kw["bind"]
    statements: list[str] = []

    def keep(_connection: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(" ".join(statement.split()))

    sa.event.listen(engine, "before_cursor_execute", keep)
    return statements, lambda: sa.event.remove(engine, "before_cursor_execute", keep)


def test_a_group_reads_its_attempts_records_its_statuses_and_drops_its_payloads_in_a_statement_each(
    context: SendContext, enqueuer: ListEnqueuer
) -> None:
    ids = [_send(context, reminder(f"trk-s{n}", identifier=f"trk-s{n}", phone=f"+1555040060{n}")) for n in range(4)]
    messages = [intake.status(context.sessions, f"trk-s{n}").message_id for n in range(4)]
    assert outcomes.apply_outcome(outcomes.Outcome(messages[3], "delivered", None), context, enqueuer) \
        == "applied_delivered"  # applied before: its report in the group is a duplicate
    rows = _recorded(
        context,
        ("s-0", {"event": "message_updated", "message_id": messages[0], "status": "delivered"}),
        ("s-1", {"event": "message_updated", "message_id": messages[1], "status": "delivered"}),
        ("s-1-read", {"event": "message_updated", "message_id": messages[1], "status": "read"}),  # after, same group
        ("s-2", {"event": "message_updated", "message_id": messages[2], "status": "delivered"}),
        ("s-2-copy", {"event": "message_updated", "message_id": messages[2], "status": "delivered"}),
        ("s-3", {"event": "message_updated", "message_id": messages[3], "status": "delivered"}),
        ("s-not-ours", {"event": "message_updated", "message_id": 990001, "status": "delivered"}),
    )
    statements, stop = _statements_during(context)
    try:
        result = process_deliveries(rows, context, enqueuer)
    finally:
        stop()
    with context.sessions() as session:
        words = dict(session.execute(sa.select(WebhookDelivery.id, WebhookDelivery.outcome)
                                     .where(WebhookDelivery.id.in_(rows))).all())
        assert all(store.load_payload(session, notification_id) is None for notification_id in ids)
    # each as it would end alone, one after the other
    assert [words[row] for row in rows] == ["applied_delivered", "applied_delivered", "applied_read",
                                            "applied_delivered", "duplicate_status", "duplicate_status",
                                            "ignored_not_ours"]
    assert result.words == {"applied_delivered": 3, "applied_read": 1, "duplicate_status": 2, "ignored_not_ours": 1}
    assert [intake.status(context.sessions, f"trk-s{n}").state for n in range(4)] == ["delivered", "read", "delivered",
                                                                                        "delivered"]

    def count(start: str, *within: str) -> int:
        return sum(statement.upper().startswith(start) and all(part in statement.upper() for part in within)
                   for statement in statements)

    # one statement each for the whole group (seven deliveries), not one per delivery
    assert count("SELECT", "FROM ATTEMPTS") == 1
    assert count("INSERT INTO APPLIED_STATUSES") == 1
    assert count("DELETE FROM PAYLOADS") == 1
    # the moves, one statement per kind of change: s-0, s-1 and s-2 to delivered together (an
    # executemany), then s-1-read alone (a second move of one attempt comes in a later round)
    assert count("UPDATE ATTEMPTS") == 2
    assert count("UPDATE NOTIFICATIONS") == 2  # their notifications follow the same way


def test_a_mixed_group_of_deliveries_each_ends_as_it_would_alone(
    context: SendContext, sandbox: SandboxProcess, enqueuer: ListEnqueuer
) -> None:
    delivered_id = _send(context, reminder("trk-m1", identifier="trk-m1", phone="+15550400811"))
    failing_id = _send(context, reminder("trk-m2", identifier="trk-m2", phone="+15550107812"))  # 131026 on WhatsApp
    waiting_id = _send(context, reminder("trk-m3", identifier="trk-m3", phone="+15550400813"))
    delivered, failing, waiting = (intake.status(context.sessions, f"trk-m{n}").message_id for n in (1, 2, 3))
    error = _sandbox_status(sandbox, failing, {"failed"})["external_error"]  # type: ignore[arg-type]
    rows = _recorded(
        context,
        ("m-1", {"event": "message_updated", "message_id": delivered, "status": "delivered"}),
        ("m-2", {"event": "message_updated", "message_id": failing, "status": "failed", "external_error": error}),
        ("m-1-copy", {"event": "message_updated", "message_id": delivered, "status": "delivered"}),  # the same news again
        ("m-3", {"event": "message_updated", "message_id": waiting}),  # a stock event: no status, read after a wait
        ("m-in", {"event": "message_created", "message_id": 777001, "message_type": "incoming", "contact_id": 5,
                  "inbox_id": 1}),
        ("m-bad", {"event": "message_updated", "message_id": "not a number"}),
    )
    with context.sessions.begin() as session:  # one the task finds processed already (its single task ran first)
        store.mark_delivery_processed(session, rows[4], outcome="window_opened", now=context.clock())
        # m-3's message was read a moment before it came (for an earlier update): its next read waits, to answer
        # the burst
        store.note_read(session, context.settings.workspace_name, [waiting], at=context.clock() - timedelta(seconds=1))
    result = process_deliveries(rows, context, enqueuer)
    assert result.words == {"applied_delivered": 1, "fallback": 1, "duplicate_status": 1, "already_processed": 1,
                            "ignored_unreadable": 1}
    assert result.waiting == [rows[3]] and 0 < result.wait_s <= context.settings.status_read_wait_s
    assert intake.status(context.sessions, "trk-m1").state == "delivered"
    failed = intake.status(context.sessions, "trk-m2")
    assert (failed.fallback_decision, failed.fallback_reason) == ("fallback", "undeliverable (131026)")
    assert enqueuer.sent == [failing_id]  # the decision's one fallback, published
    assert intake.status(context.sessions, "trk-m3").state == "sent"
    with context.sessions() as session:
        outcomes_by_row = dict(session.execute(sa.select(WebhookDelivery.id, WebhookDelivery.outcome)
                                               .where(WebhookDelivery.id.in_(rows))).all())
    assert [outcomes_by_row[row] for row in rows] == ["applied_delivered", "fallback", "duplicate_status", None,
                                                      "window_opened", "ignored_unreadable"]
    assert delivered_id != waiting_id


def test_a_delivery_that_breaks_the_shared_transaction_costs_the_others_nothing(
    context: SendContext, enqueuer: ListEnqueuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(3):
        _send(context, reminder(f"trk-p{n}", identifier=f"trk-pb{n}", phone=f"+1555040070{n}"))
    messages = [intake.status(context.sessions, f"trk-p{n}").message_id for n in range(3)]
    rows = _recorded(context, *((f"p-{n}", {"event": "message_updated", "message_id": message, "status": "delivered"})
                                for n, message in enumerate(messages)))
    real_apply_in = outcomes.apply_in

    def apply_in(session: Any, outcome: outcomes.Outcome, ctx: SendContext, *args: Any, **kwargs: Any) -> outcomes.Applied:
        if outcome.message_id == messages[1]:
            raise RuntimeError("a delivery this version cannot apply")
        return real_apply_in(session, outcome, ctx, *args, **kwargs)

    monkeypatch.setattr(outcomes, "apply_in", apply_in)
    result = process_deliveries(rows, context, enqueuer)
    assert result.words == {"applied_delivered": 2}  # each applied alone once the shared transaction failed
    assert [intake.status(context.sessions, f"trk-p{n}").state for n in range(3)] == ["delivered", "sent", "delivered"]
    with context.sessions() as session:
        broken = session.get(WebhookDelivery, rows[1])
        assert broken is not None
        # left for the tracking sweep, with why; one try spent, as a single task's run would
        assert (broken.processed_at, broken.tries, broken.last_error) == (None, 1, "RuntimeError")
