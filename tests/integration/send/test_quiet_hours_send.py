"""Quiet hours hold every start of a send, not only the hand-over: a fallback decided at night on
a route with a send window waits for the window's opening, saying until when, and goes then; a run
whose window opens only past the send deadline fails with that reason, without a fallback; a
resend after an unknown outcome waits for the window too. Against the sandbox process,
with the send path's clock set by the test."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.sending.send import Outcome, send_notification
from dispatcher.store import queries as store
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import drive, example_settings, reminder, send_context
from tests.support.sandbox_process import SandboxProcess

pytestmark = pytest.mark.integration

NIGHT = datetime(2026, 11, 26, 22, 30, tzinfo=UTC)  # 23:30 in Berlin
OPENING = datetime(2026, 11, 27, 7, 0, tzinfo=UTC)  # 08:00 in Berlin
SERVER_ERRORS = {"createMessage": {"server_error_share": 1.0}}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture()
def clock() -> Clock:
    return Clock(NIGHT)


@pytest.fixture()
def night_context(sandbox: SandboxProcess, tmp_path: Path, clock: Clock,
                  clean_environment: pytest.MonkeyPatch) -> Iterator[SendContext]:
    """The example configuration, its SMS route sending 08:00-20:00 in Berlin, at 23:30 there."""
    sandbox.reset()
    routes = tomllib.loads((REPO_ROOT / "config" / "dispatcher.example.toml").read_text())["routes"]
    routes["sms"] |= {"send_window": "08:00-20:00"}
    settings = example_settings(api_url=sandbox.base_url, database_url=f"sqlite:///{tmp_path}/quiet.sqlite",
                                routes=routes, default_time_zone="Europe/Berlin", send_deadline_s=46_800.0)
    with send_context(settings) as ctx:
        yield replace(ctx, clock=clock)


def _hand_over(context: SendContext, request: dict[str, object], now: datetime) -> int:
    intake.accept(parse_request(request), sessions=context.sessions, settings=context.settings,
                  enqueuer=ListEnqueuer(), clock=lambda: now)
    with context.sessions() as session:
        notification = store.find_notification_by_event(session, str(request["event_id"]))
        assert notification is not None
        return notification.id


def test_a_fallback_decided_at_night_waits_for_its_route_s_window(
        night_context: SendContext, sandbox: SandboxProcess, clock: Clock) -> None:
    # Given a reminder (no window on its route) whose message fails at night: the SMS fallback is decided
    notification_id = _hand_over(night_context, reminder("evt-night-fallback", identifier="p-night",
                                                         phone="+15550300201"), NIGHT)
    sandbox.set_faults(SERVER_ERRORS)
    drive(night_context, notification_id)
    sandbox.set_faults({})
    assert intake.status(night_context.sessions, "evt-night-fallback").fallback_decision == "fallback"
    # When the fallback's run comes at 23:30 Berlin time, it calls nothing and waits, saying until when
    waiting = send_notification(notification_id, night_context)
    assert (waiting.outcome, waiting.deferred, waiting.delay_s) == (Outcome.RETRY, True,
                                                                    (OPENING - NIGHT).total_seconds())
    record = intake.status(night_context.sessions, "evt-night-fallback")
    assert (record.state, record.error_kind) == ("falling_back", "quiet_hours")
    assert record.error_detail is not None and "2026-11-27 07:00 UTC" in record.error_detail
    assert sandbox.messages_per_event()["evt-night-fallback"] == 0
    # Then at 08:00 it goes, once, and the wait's reason is gone from the moment it is claimed
    clock.now = OPENING
    from dispatcher import faults

    claimed: list[tuple[str, str | None]] = []

    def look(site: str, in_transaction: bool) -> None:  # at the createMessage call: the claim is committed
        if site == "before createMessage":
            record = intake.status(night_context.sessions, "evt-night-fallback")
            claimed.append((record.state, record.error_kind))

    previous = faults.install(look)
    try:
        assert drive(night_context, notification_id)[-1].outcome is Outcome.ACCEPTED
    finally:
        faults.install(previous)
    assert claimed == [("falling_back", None)]
    sent = intake.status(night_context.sessions, "evt-night-fallback")
    assert (sent.error_kind, sent.channel) == (None, "sms")
    assert sandbox.messages_per_event()["evt-night-fallback"] == 1


def test_a_window_that_opens_past_the_send_deadline_fails_the_notification_saying_so(
        night_context: SendContext, sandbox: SandboxProcess, clock: Clock) -> None:
    # Given an SMS handed over at 18:30 Berlin time, inside the window, whose run comes only at 23:30
    evening = NIGHT - timedelta(hours=5)
    notification_id = _hand_over(night_context, reminder("evt-late-run", identifier="p-late", phone="+15550300202",
                                                         route="sms"), evening)
    assert intake.status(night_context.sessions, "evt-late-run").state == "queued"
    # When the window opens 13.5 hours after it was due, past its 13-hour send deadline
    result = send_notification(notification_id, night_context)
    # Then it fails now, with that reason, and nothing is sent
    assert result.outcome is Outcome.FAILED
    record = intake.status(night_context.sessions, "evt-late-run")
    assert (record.state, record.error_kind, record.fallback_decision) == ("failed", "window_past_deadline", "none")
    assert record.error_detail is not None and "quiet hours" in record.error_detail
    assert sandbox.messages_per_event()["evt-late-run"] == 0


def test_a_resend_after_an_unknown_outcome_waits_for_the_window_too(
        night_context: SendContext, sandbox: SandboxProcess, clock: Clock) -> None:
    # Given an SMS whose createMessage fails with a server error at 19:59 Berlin time (its outcome unknown)
    clock.now = datetime(2026, 11, 26, 18, 59, tzinfo=UTC)
    notification_id = _hand_over(night_context, reminder("evt-unknown-late", identifier="p-unknown",
                                                         phone="+15550300203", route="sms"), clock.now)
    sandbox.set_faults(SERVER_ERRORS)
    assert send_notification(notification_id, night_context).outcome is Outcome.RETRY
    sandbox.set_faults({})
    # When its next run comes at 20:05, the look for an earlier message finds none
    clock.now = datetime(2026, 11, 26, 19, 5, tzinfo=UTC)
    waiting = send_notification(notification_id, night_context)
    # Then it does not send in quiet hours: it waits for the opening, and goes then, once
    assert (waiting.outcome, waiting.deferred) == (Outcome.RETRY, True)
    assert intake.status(night_context.sessions, "evt-unknown-late").error_kind == "quiet_hours"
    assert sandbox.messages_per_event()["evt-unknown-late"] == 0
    clock.now = OPENING
    assert drive(night_context, notification_id)[-1].outcome is Outcome.ACCEPTED
    assert sandbox.messages_per_event()["evt-unknown-late"] == 1
