"""Crashes cost no notification (issue 22): the send path's two budgets, against a real sandbox process.

Provider tries count only calls that reached the workspace and failed; runs of the task that died
are the crash guard, apart. A process that dies is played by :class:`Killed`, raised at one of the
product's own crash points (dispatcher/faults.py): nothing of ours catches it, so the transaction in
flight is lost and the run ends there, as with a SIGKILL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from dispatcher import faults, service
from dispatcher.api import WorkspaceClient
from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import StateConflict
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.lifecycle import moves, worklists
from dispatcher.lifecycle.states import AttemptState
from dispatcher.metrics import NotificationStates, render
from dispatcher.operations import set_aside
from dispatcher.operations.cli import exits
from dispatcher.operations.cli.main import cli
from dispatcher.sending.send import Outcome, SendResult, send_notification, set_aside_unconfigured
from dispatcher.store import queries as store
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Attempt, utcnow
from tests.support.dispatcher_setup import reminder
from tests.support.sandbox_process import SandboxProcess

pytestmark = pytest.mark.integration


class Killed(BaseException):
    """The process died at this point (a SIGKILL): no code of ours catches a BaseException."""


def _accept(ctx: SendContext, event_id: str, phone: str, **changes: str) -> int:
    intake.accept(parse_request(reminder(event_id, identifier=f"pat-{event_id}", phone=phone, **changes)),
                  sessions=ctx.sessions, settings=ctx.settings, enqueuer=ListEnqueuer())
    with ctx.sessions() as session:
        notification = store.find_notification_by_event(session, event_id)
        assert notification is not None
        return notification.id


def _create_calls(sandbox: SandboxProcess) -> int:
    return int(sandbox.stats()["calls"].get("createMessage", 0))


def _attempt(ctx: SendContext, notification_id: int) -> Attempt:
    with ctx.sessions() as session:
        return store.attempts_of(session, notification_id)[0]


@contextmanager
def _dies(when: Callable[[str, int], bool]) -> Iterator[list[str]]:
    """The run dies at the first crash point for which ``when(point, index)`` holds (index: the
    point's number in this run, from 1); the points it died at are listed."""
    died: list[str] = []
    passed = 0

    def hook(point: str, in_transaction: bool) -> None:
        nonlocal passed
        passed += 1
        if not died and when(point, passed):
            died.append(point)
            raise Killed(point)

    previous = faults.install(hook)
    try:
        yield died
    finally:
        faults.install(previous)


def _deliver(ctx: SendContext, notification_id: int, when: Callable[[str, int], bool] | None = None) -> SendResult | str:
    """One delivery of the send task by the broker: its result, or the point where its process died."""
    if when is None:
        return send_notification(notification_id, ctx)
    with _dies(when) as died:
        try:
            return send_notification(notification_id, ctx)
        except Killed:
            return f"died {died[0]}"


def test_a_task_delivered_ten_times_spends_no_provider_try_and_sends_one_message(
        context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a notification whose send task the broker delivers ten times: three deliveries die on
    # their way (after the run's first commit, its second point, its third), one dies right after
    # createMessage reached the workspace, two twins come while that call's lease still runs,
    # then one after the lease, and three duplicates after it is recorded
    notification_id = _accept(context, "evt-ten", "+15550300070")
    outcomes = [
        _deliver(context, notification_id, lambda point, _: point == "after commit"),
        _deliver(context, notification_id, lambda _, index: index == 2),
        _deliver(context, notification_id, lambda _, index: index == 3),
        _deliver(context, notification_id, lambda point, _: point == "after createMessage"),
        _deliver(context, notification_id),
        _deliver(context, notification_id),
    ]
    assert all(isinstance(outcome, str) for outcome in outcomes[:4]), outcomes
    assert [outcome.outcome for outcome in outcomes[4:] if isinstance(outcome, SendResult)] == [Outcome.RETRY] * 2
    lease_until = _attempt(context, notification_id).lease_until
    assert lease_until is not None
    context.clock = lambda: lease_until + timedelta(seconds=1)  # type: ignore[method-assign]
    outcomes += [_deliver(context, notification_id) for _ in range(4)]
    # Then the one message that exists is adopted, none is sent again, and no provider try is spent
    results = [outcome.outcome for outcome in outcomes[6:] if isinstance(outcome, SendResult)]
    assert results == [Outcome.ADOPTED, Outcome.SKIPPED, Outcome.SKIPPED, Outcome.SKIPPED], outcomes
    assert _create_calls(sandbox) == 1
    attempt = _attempt(context, notification_id)
    assert attempt.state in (AttemptState.ACCEPTED, AttemptState.SENT, AttemptState.DELIVERED, AttemptState.READ)
    assert attempt.tries == 0
    # the four deaths (each after its run was counted) and the run that adopted, which ended the attempt
    # (no run reads the count again); the twins that waited and the duplicates gave theirs back
    assert attempt.runs == 5
    assert intake.status(context.sessions, "evt-ten").fallback_decision is None


def _assert_set_aside(ctx: SendContext, sandbox: SandboxProcess, result: SendResult, notification_id: int, event_id: str,
                      error_kind: str, said: str) -> None:
    """Set aside with ``error_kind`` and a detail saying ``said``: nothing sent, no fallback, and
    the sweep leaves it, however late, until an operator's retry."""
    assert result.outcome is Outcome.SET_ASIDE
    record = intake.status(ctx.sessions, event_id)
    assert (record.state, record.error_kind, record.fallback_decision) == ("queued", error_kind, None)
    assert record.error_detail is not None and said in record.error_detail
    assert _create_calls(sandbox) == 0
    with ctx.sessions.begin() as session:
        later = utcnow() + timedelta(days=1)
        assert notification_id not in [row.id for row in worklists.due_for_enqueue(
            session, now=later, stale_before=later, limit=100, send_queue_empty=True)]


def test_a_notification_whose_workspace_left_the_configuration_is_set_aside_saying_which(
        context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a notification handed over for a workspace that the configuration no longer names
    notification_id = _accept(context, "evt-gone", "+15550300072")
    # When its send task finds no workspace to send it with (workers/tasks.py asks this)
    result = set_aside_unconfigured(notification_id, "clinic-north", context)
    # Then it is set aside with why, nothing is sent, and the sweep leaves it until an operator's retry
    _assert_set_aside(context, sandbox, result, notification_id, "evt-gone", moves.WORKSPACE_UNCONFIGURED,
                      "'clinic-north' is not configured")


def test_a_notification_whose_route_left_the_configuration_is_set_aside_until_it_is_back_and_retried(
        context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a notification handed over on the portal route, which a redeploy then removes
    notification_id = _accept(context, "evt-no-route", "+15550300073", route="portal")
    configured = context.settings.model_dump()
    configured["routes"] = {name: route for name, route in configured["routes"].items() if name != "portal"}
    without_portal = type(context.settings).model_validate(configured)
    # When its send task runs: set aside, saying which route, nothing sent, no fallback, and the sweep leaves it
    # (before, the run was skipped and the sweep handed it over again every stale_after_s, for ever)
    result = send_notification(notification_id, replace(context, settings=without_portal))
    _assert_set_aside(context, sandbox, result, notification_id, "evt-no-route", moves.ROUTE_UNCONFIGURED, "'portal' is not configured")
    # And once the route is configured again, an operator's retry sends it, once
    set_aside.retry(context.sessions, "evt-no-route")
    assert send_notification(notification_id, context).outcome is Outcome.ACCEPTED
    assert _create_calls(sandbox) == 1


def test_a_task_that_keeps_dying_is_set_aside_as_crash_loop_and_an_operator_retry_sends_it_once(
        context: SendContext, sandbox: SandboxProcess, tmp_path: Path) -> None:
    # Given a send task that dies right after its first commit, every time
    notification_id = _accept(context, "evt-loop", "+15550300071")
    limit = context.settings.send_max_runs
    deaths = [_deliver(context, notification_id, lambda point, _: point == "after commit") for _ in range(limit)]
    assert all(isinstance(death, str) for death in deaths)
    # When it is delivered once more
    result = send_notification(notification_id, context)
    # Then it is set aside, visibly, not failed: no try spent, no fallback, nothing sent, and the sweep leaves it
    assert result.outcome is Outcome.SET_ASIDE
    record = intake.status(context.sessions, "evt-loop")
    assert (record.state, record.error_kind, record.fallback_decision) == ("queued", moves.CRASH_LOOP, None)
    assert record.error_detail is not None and f"died {limit} times" in record.error_detail
    assert _attempt(context, notification_id).tries == 0
    assert _create_calls(sandbox) == 0
    assert "dispatcher_notifications_set_aside 1.0" in render(NotificationStates(context.sessions)).decode()
    with context.sessions.begin() as session:
        later = utcnow() + timedelta(days=1)
        assert notification_id not in [row.id for row in worklists.due_for_enqueue(session, now=later, stale_before=later, limit=100,
                                                                send_queue_empty=True)]
    # And an operator's retry (once the cause is fixed) hands it back to the sweep, and it is sent once
    set_aside.retry(context.sessions, "evt-loop")
    with context.sessions.begin() as session:
        assert notification_id in [row.id for row in worklists.due_for_enqueue(session, now=utcnow(), stale_before=utcnow(), limit=100,
                                                            send_queue_empty=True)]
    assert "dispatcher_notifications_set_aside 0.0" in render(NotificationStates(context.sessions)).decode()
    assert send_notification(notification_id, context).outcome is Outcome.ACCEPTED
    assert _create_calls(sandbox) == 1
    with pytest.raises(StateConflict, match="not set aside"):
        set_aside.retry(context.sessions, "evt-loop")


def test_the_retry_command_says_in_one_line_what_is_wrong(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setattr(service, "_default", None)  # the command's dispatcher is this test's, and forgotten after
    env = {"DISPATCHER_CONFIG": str(Path(__file__).parents[3] / "config" / "dispatcher.example.toml"),
           "DISPATCHER_DATABASE_URL": f"sqlite:///{tmp_path}/cli.sqlite"}
    upgrade_database(env["DISPATCHER_DATABASE_URL"])
    result = CliRunner().invoke(cli, ["retry", "no-such-event"], env=env)
    assert result.exit_code == exits.FAILED, result.output
    assert result.output.strip().splitlines() == ["error: no notification with event_id 'no-such-event'"]


def test_out_of_tries_an_attempt_an_earlier_run_claimed_looks_before_it_fails_and_adopts_its_message(
        context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a run that died right after createMessage reached the workspace (the message exists),
    # and its attempt queued again with every try spent (as the code before issue 22 could leave it)
    notification_id = _accept(context, "evt-look-first", "+15550300072")
    assert isinstance(_deliver(context, notification_id, lambda point, _: point == "after createMessage"), str)
    with context.sessions.begin() as session:
        attempt = session.get(Attempt, _attempt(context, notification_id).id)
        assert attempt is not None and attempt.state == AttemptState.IN_FLIGHT
        attempt.state, attempt.tries, attempt.lease_until = AttemptState.QUEUED, context.plan.max_tries, None
    # When the next run finds the attempt out of tries
    result = send_notification(notification_id, context)
    # Then it reads the conversation first and adopts the message: no failure, no fallback, no second message
    assert result.outcome is Outcome.ADOPTED, result.reason
    assert intake.status(context.sessions, "evt-look-first").fallback_decision is None
    assert _create_calls(sandbox) == 1


def test_out_of_tries_with_no_earlier_claim_fails_without_a_read(context: SendContext, sandbox: SandboxProcess) -> None:
    # Given an attempt never claimed, every try spent by answers that refused (503 on the search)
    notification_id = _accept(context, "evt-spent", "+15550300073")
    sandbox.set_faults({"searchContacts": {"server_error_share": 1.0}})
    results = [send_notification(notification_id, context) for _ in range(context.plan.max_tries)]
    # Then the last answer ends it tries_exhausted, counting exactly the calls that failed
    assert [r.outcome for r in results] == [Outcome.RETRY] * (context.plan.max_tries - 1) + [Outcome.FAILED]
    attempt = _attempt(context, notification_id)
    assert (attempt.state, attempt.error_kind, attempt.tries) == (AttemptState.FAILED, "tries_exhausted",
                                                                 context.plan.max_tries)
    assert sandbox.stats()["calls"].get("listMessages", 0) == 0
    assert _create_calls(sandbox) == 0


def _died_between_a_failure_and_its_decision(context: SendContext, sandbox: SandboxProcess, event_id: str,
                                             phone: str) -> int:
    """A notification whose run spent the attempt's last try (503s on the search) and died right
    after it recorded the failure, before the fallback decision."""
    notification_id = _accept(context, event_id, phone)
    sandbox.set_faults({"searchContacts": {"server_error_share": 1.0}})
    for _ in range(context.plan.max_tries - 1):
        assert send_notification(notification_id, context).outcome is Outcome.RETRY

    def after_the_failure_commits(point: str, _: int) -> bool:
        return point == "after commit" and _attempt(context, notification_id).state == AttemptState.FAILED

    assert _deliver(context, notification_id, after_the_failure_commits) == "died after commit"
    sandbox.set_faults({})
    return notification_id


def test_a_run_that_died_between_a_failure_and_its_decision_leaves_the_decision_to_the_next_run(
        context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a run that spent the attempt's last try (503s on the search) and died right after it
    # recorded the failure, before the fallback decision
    notification_id = _died_between_a_failure_and_its_decision(context, sandbox, "evt-owed", "+15550300074")
    record = intake.status(context.sessions, "evt-owed")
    assert (record.attempts[0].error_kind, record.fallback_decision) == ("tries_exhausted", None)
    # When the broker delivers the task again (the worker's child died: late acknowledgement)
    enqueuer = ListEnqueuer()
    context.enqueuer = enqueuer
    result = send_notification(notification_id, context)
    # Then that run makes the owed decision at once, as the sweep's repair would later: the fallback
    assert result.outcome is Outcome.SKIPPED and "owed decision made now: fallback" in result.reason
    record = intake.status(context.sessions, "evt-owed")
    assert (record.state, record.fallback_decision, record.fallback_reason) == (
        "falling_back", "fallback", "send_failed (tries_exhausted)")
    assert enqueuer.sent == [notification_id]
    # and the fallback's own run sends it, once
    assert send_notification(notification_id, context).outcome is Outcome.ACCEPTED
    assert intake.status(context.sessions, "evt-owed").channel == "sms"


def test_an_owed_decision_is_made_while_the_workspace_is_away_and_keeps_the_failure_s_reason(
        context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a run that spent the attempt's last try and died right after it recorded the failure,
    notification_id = _died_between_a_failure_and_its_decision(context, sandbox, "evt-owed-away", "+15550300075")
    # and then a workspace every worker waits for (another worker's call could not connect)
    context.breaker.trip("unreachable", "ConnectError")
    enqueuer = ListEnqueuer()
    context.enqueuer = enqueuer
    # When the broker delivers the task again
    result = send_notification(notification_id, context)
    # Then the owed decision is made at once (it calls nothing), and the record keeps the reason the
    # attempt failed with, not the pause's: the simulation's redeliveries world (seed 8) found a
    # 404's failure shown, and ended, as "unreachable"
    assert result.outcome is Outcome.SKIPPED and "owed decision made now: fallback" in result.reason, result.reason
    record = intake.status(context.sessions, "evt-owed-away")
    assert (record.state, record.error_kind, record.fallback_reason) == (
        "falling_back", "tries_exhausted", "send_failed (tries_exhausted)")
    assert enqueuer.sent == [notification_id]


def test_a_workspace_away_past_the_send_deadline_ends_a_dead_run_s_attempt_unknown_without_a_fallback(
        context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a run that died right after createMessage reached the workspace (the message exists),
    notification_id = _accept(context, "evt-away", "+15550300074")
    assert isinstance(_deliver(context, notification_id, lambda point, _: point == "after createMessage"), str)
    # and from then on a workspace that refuses the token, until past the send deadline
    refused = context.settings.model_copy(update={"api_token": SecretStr("a-token-the-workspace-refuses")})
    later = utcnow() + timedelta(seconds=context.settings.send_deadline_s + 60)
    context.clock = lambda: later  # type: ignore[method-assign]
    # When the next run cannot look for that message
    with WorkspaceClient.from_settings(refused) as away:
        context.api = away
        result = send_notification(notification_id, context)
    # Then the attempt ends outcome_unknown (the message may exist), and no fallback goes to the same
    # person: the simulation's outage world found a fallback decided, and the record failed `auth`,
    # for a message the person had
    assert result.outcome is Outcome.FAILED, result.reason
    record = intake.status(context.sessions, "evt-away")
    assert (record.state, record.error_kind, record.fallback_decision) == ("failed", "outcome_unknown", "none")
    assert record.error_detail is not None and "may have sent it" in record.error_detail
    assert _create_calls(sandbox) == 1
