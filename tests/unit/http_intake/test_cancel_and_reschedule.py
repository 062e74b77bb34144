"""A host cancels or moves a notification: over HTTP (DELETE and PATCH on its URL), in Python and
from the command line. Cancelled means nothing is sent and the content is gone; too late names
the state; a bad time names send_at."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session, sessionmaker

import dispatcher.service as service
from dispatcher.errors import InvalidEvent, TooLate, UnknownNotification
from dispatcher.lifecycle import moves
from dispatcher.operations.cli.main import cli
from dispatcher.sending.send import Outcome, send_notification
from dispatcher.store import queries as store
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import send_context
from tests.support.store_scan import kept_anywhere
from tests.unit.http_intake.conftest import AUTH, CONTENT, PATH, PHONE, Intake, valid_request


def later(hours: float = 2) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


def claim_first_attempt(intake: Intake, event_id: str) -> None:
    """A worker has the notification: its first attempt is claimed, createMessage may be running."""
    now = datetime.now(UTC)
    with intake.dispatcher.sessions.begin() as session:
        notification = store.find_notification_by_event(session, event_id)
        assert notification is not None
        attempt = moves.open_attempt(session, notification_id=notification.id, number=1, route="reminders",
                                     channel="messaging_platform", now=now)
        assert moves.claim(session, notification_id=notification.id, attempt_id=attempt.id, fallback=False, now=now,
                           target=moves.Target(inbox_id=1, contact_id=1, conversation_id=1,
                                               channel="messaging_platform", content_hash="h" * 64),
                           lease_until=now + timedelta(seconds=60), seen_claims=0)


def test_delete_cancels_a_queued_notification_and_its_content_goes(intake: Intake) -> None:
    assert intake.post(valid_request("appt-1")).status_code == 202
    response = intake.client.delete(f"{PATH}/appt-1", headers=AUTH)
    assert response.status_code == 200, response.text
    record = response.json()
    assert (record["state"], record["error_kind"], record["message_id"]) == ("cancelled", "cancelled", None)
    assert [(a["number"], a["state"], a["error_kind"]) for a in record["attempts"]] == [(1, "failed", "cancelled")]
    assert intake.payloads() == 0
    assert kept_anywhere(intake.dispatcher.sessions, [PHONE, CONTENT]) == []
    again = intake.client.delete(f"{PATH}/appt-1", headers=AUTH)  # a host's retry of its call
    assert again.status_code == 200 and again.json()["state"] == "cancelled"


def test_the_send_task_that_comes_after_a_cancel_sends_nothing(intake: Intake) -> None:
    intake.post(valid_request("appt-2"))
    intake.dispatcher.cancel("appt-2")
    [notification_id] = intake.enqueuer.sent
    with send_context(intake.dispatcher.settings) as context:  # its API URL answers nothing: a call would fail
        result = send_notification(notification_id, context)
    assert result.outcome is Outcome.SKIPPED
    assert intake.dispatcher.status("appt-2").state == "cancelled"


def test_a_notification_a_worker_holds_is_too_late_to_cancel_with_its_state(intake: Intake) -> None:
    intake.post(valid_request("appt-3"))
    claim_first_attempt(intake, "appt-3")
    response = intake.client.delete(f"{PATH}/appt-3", headers=AUTH)
    assert response.status_code == 409
    assert response.json() == {"error": "too_late", "field": "state", "state": "sending",
                               "detail": "too late to cancel: it is sending"}
    with pytest.raises(TooLate) as late:
        intake.dispatcher.cancel("appt-3")
    assert late.value.state == "sending"
    assert intake.dispatcher.status("appt-3").state == "sending" and intake.payloads() == 1


def test_patch_moves_a_scheduled_notification_and_refuses_a_bad_time(intake: Intake) -> None:
    intake.post(valid_request("appt-4", send_at=later(2)))
    new_time = later(30)
    response = intake.client.patch(f"{PATH}/appt-4", json={"send_at": new_time}, headers=AUTH)
    assert response.status_code == 200, response.text
    assert datetime.fromisoformat(response.json()["send_at"]) == datetime.fromisoformat(new_time)
    for body, field in (({"send_at": "tomorrow"}, "send_at"), ({"send_at": "2026-12-01T09:00:00"}, "send_at"),
                        ({"send_at": "2000-01-01T09:00:00+00:00"}, "send_at"), ({"when": new_time}, "body"),
                        ([], "body")):
        refused = intake.client.patch(f"{PATH}/appt-4", json=body, headers=AUTH)
        assert (refused.status_code, refused.json()["field"]) == (422, field), body
    assert datetime.fromisoformat(intake.client.get(f"{PATH}/appt-4", headers=AUTH).json()["send_at"]) \
        == datetime.fromisoformat(new_time)


def test_only_a_scheduled_notification_is_rescheduled(intake: Intake) -> None:
    intake.post(valid_request("appt-5"))
    response = intake.client.patch(f"{PATH}/appt-5", json={"send_at": later()}, headers=AUTH)
    assert response.status_code == 409 and response.json()["state"] == "queued"
    intake.post(valid_request("appt-6", send_at=later()))
    intake.dispatcher.cancel("appt-6")
    with pytest.raises(TooLate, match="too late to reschedule 'appt-6': it is cancelled"):
        intake.dispatcher.reschedule("appt-6", datetime.now(UTC) + timedelta(days=1))


def test_the_item_url_needs_the_token_and_a_known_event(intake: Intake) -> None:
    intake.post(valid_request("appt-7"))
    assert intake.client.delete(f"{PATH}/appt-7", headers={}).status_code == 401
    assert intake.client.patch(f"{PATH}/appt-7", json={"send_at": later()}).status_code == 401
    assert intake.dispatcher.status("appt-7").state == "queued"
    assert intake.client.delete(f"{PATH}/no-such", headers=AUTH).status_code == 404
    with pytest.raises(UnknownNotification):
        intake.dispatcher.cancel("no-such")
    with pytest.raises(InvalidEvent, match="send_at"):
        intake.dispatcher.reschedule("appt-7", datetime.now() + timedelta(days=1))  # no time zone


def test_the_cancel_and_reschedule_commands_answer_in_one_line_with_exit_codes(
    tmp_path: Path, clean_environment: pytest.MonkeyPatch,
) -> None:
    clean_environment.setattr(service, "_default", None)  # the commands' dispatcher is this test's, forgotten after
    clean_environment.setenv("DISPATCHER_CONFIG", str(REPO_ROOT / "config" / "dispatcher.example.toml"))
    clean_environment.setenv("DISPATCHER_DATABASE_URL", f"sqlite:///{tmp_path}/cli.sqlite")
    clean_environment.setenv("DISPATCHER_BROKER_URL", "memory://")
    service.default_dispatcher().notify(valid_request("appt-8", send_at=later()))
    runner = CliRunner()

    moved = runner.invoke(cli, ["reschedule", "appt-8", "2099-01-01T09:00:00+01:00"])
    assert (moved.exit_code, moved.output) == (0, "appt-8: scheduled for 2099-01-01T08:00:00+00:00\n")
    bad = runner.invoke(cli, ["reschedule", "appt-8", "soon"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "send_at" in bad.output
    cancelled = runner.invoke(cli, ["cancel", "appt-8"])
    assert (cancelled.exit_code, cancelled.output) == (0, "appt-8: cancelled\n")
    late = runner.invoke(cli, ["reschedule", "appt-8", "2099-01-01T09:00:00+01:00"])
    assert (late.exit_code, late.output.strip()) == (1, "appt-8: too late to reschedule: it is cancelled")
    unknown = runner.invoke(cli, ["cancel", "no-such"])
    assert (unknown.exit_code, unknown.output.strip()) == (1, "error: no notification with event_id 'no-such'")


def test_the_examples_in_the_docs_work_as_written(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setattr(service, "_default", None)
    clean_environment.setenv("DISPATCHER_CONFIG", str(REPO_ROOT / "config" / "dispatcher.example.toml"))
    clean_environment.setenv("DISPATCHER_DATABASE_URL", f"sqlite:///{tmp_path}/docs.sqlite")
    clean_environment.setenv("DISPATCHER_BROKER_URL", "memory://")
    section = (REPO_ROOT / "docs" / "notifications.md").read_text().split("## Cancelling it, or moving its time")[1]
    python_block = section.split("```python\n")[1].split("```")[0]
    shell_block = section.split("```sh\n")[1].split("```")[0]
    runner = CliRunner()
    for run in ("python", "shell"):
        service.default_dispatcher().notify(valid_request("appt-2026-0002", send_at=later()))
        if run == "python":
            namespace: dict[str, Any] = {}
            exec(compile(python_block, "docs/notifications.md", "exec"), namespace)  # noqa: S102 - our own docs
            assert namespace["record"].state == "cancelled"
        else:
            for line in shell_block.strip().splitlines():
                arguments = line.split("#")[0].split()
                assert arguments[0] == "dispatcher"
                result = runner.invoke(cli, arguments[1:])
                assert result.exit_code == 0, (line, result.output)
            assert service.default_dispatcher().status("appt-2026-0002").state == "cancelled"
        with service.default_dispatcher().sessions.begin() as session:  # the next run hands it over anew
            notification = store.find_notification_by_event(session, "appt-2026-0002")
            session.delete(notification)


def fail_notification(sessions: sessionmaker[Session], event_id: str) -> None:
    """The notification failed (its first attempt refused, no fallback), and its content went with it."""
    now = datetime.now(UTC)
    with sessions.begin() as session:
        notification = store.find_notification_by_event(session, event_id)
        assert notification is not None
        attempt = moves.open_attempt(session, notification_id=notification.id, number=1, route="reminders",
                                     channel="messaging_platform", now=now)
        assert moves.fail_attempt(session, notification_id=notification.id, attempt_id=attempt.id, seen_claims=0,
                                  error_kind="rejected", detail="422: refused", now=now)
        assert moves.decide_fallback(session, notification_id=notification.id, now=now, decision=moves.FallbackDecision(
            fall_back=False, reason="send_failed (rejected)", failed=True, error_kind="rejected"))
        store.drop_payload(session, notification.id)


def test_post_to_a_failed_notification_retries_it_with_its_request(intake: Intake) -> None:
    request = valid_request("appt-9")
    intake.post(request)
    assert intake.client.post(f"{PATH}/appt-9", headers=AUTH).json()["error"] == "not_retryable"  # queued, not failed
    fail_notification(intake.dispatcher.sessions, "appt-9")
    no_content = intake.client.post(f"{PATH}/appt-9", headers=AUTH)
    assert no_content.status_code == 409 and "content was deleted" in no_content.json()["detail"]
    other = intake.client.post(f"{PATH}/appt-9", json=valid_request("appt-9", content="Another text"), headers=AUTH)
    assert (other.status_code, other.json()["error"]) == (409, "conflict")
    retried = intake.client.post(f"{PATH}/appt-9", json=request, headers=AUTH)
    assert retried.status_code == 200, retried.text
    record = retried.json()
    assert (record["state"], record["error_kind"], record["fallback_decision"]) == ("queued", None, "none")
    assert [(a["number"], a["purpose"], a["state"]) for a in record["attempts"]] == [(1, "first", "failed"),
                                                                                     (2, "retry", "queued")]
    assert intake.payloads() == 1 and intake.enqueuer.sent[-1] == intake.enqueuer.sent[0]
    assert PHONE not in retried.text and CONTENT not in retried.text


def test_the_retry_examples_in_the_docs_work_as_written(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setattr(service, "_default", None)
    clean_environment.setenv("DISPATCHER_CONFIG", str(REPO_ROOT / "config" / "dispatcher.example.toml"))
    clean_environment.setenv("DISPATCHER_DATABASE_URL", f"sqlite:///{tmp_path}/docs.sqlite")
    clean_environment.setenv("DISPATCHER_BROKER_URL", "memory://")
    clean_environment.chdir(REPO_ROOT)  # the shell example names docs/examples/reminder.json from the checkout
    section = (REPO_ROOT / "docs" / "notifications.md").read_text().split("## Retrying a failed one")[1]
    python_block = section.split("```python\n")[1].split("```")[0]
    [shell_line] = section.split("```sh\n")[1].split("```")[0].strip().splitlines()
    request = json.loads((REPO_ROOT / "docs" / "examples" / "reminder.json").read_text())
    dispatcher = service.default_dispatcher()
    dispatcher.notify(request)
    fail_notification(dispatcher.sessions, request["event_id"])
    namespace: dict[str, Any] = {"request": request}
    exec(compile("import dispatcher\n" + python_block, "docs/notifications.md", "exec"), namespace)  # noqa: S102
    assert namespace["record"].state == "queued" and len(namespace["record"].attempts) == 2
    fail_notification_again(dispatcher.sessions, request["event_id"])
    result = CliRunner().invoke(cli, shell_line.split()[1:])
    assert result.exit_code == 0, result.output
    assert [a.purpose for a in dispatcher.status(request["event_id"]).attempts] == ["first", "retry", "retry"]


def fail_notification_again(sessions: sessionmaker[Session], event_id: str) -> None:
    """The retry's attempt failed too: the notification ends failed again (end_failed)."""
    now = datetime.now(UTC)
    with sessions.begin() as session:
        notification = store.find_notification_by_event(session, event_id)
        assert notification is not None
        attempt = moves.open_attempt(session, notification_id=notification.id, number=notification.current_attempt,
                                     route="reminders", channel="messaging_platform", now=now)
        assert moves.fail_attempt(session, notification_id=notification.id, attempt_id=attempt.id, seen_claims=0,
                                  error_kind="rejected", detail="422: refused", now=now)
        assert moves.end_failed(session, notification_id=notification.id, error_kind="rejected", detail="422", now=now)
        store.drop_payload(session, notification.id)
