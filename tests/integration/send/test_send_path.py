"""The send path against a real sandbox process, one call at a time (no Celery here).

Given a notification in the store, when the send path runs, then exactly one message exists in
the sandbox, in the conversation of its contact and inbox, and the store says so.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from dispatcher.context import READS_BUCKET, READS_PAUSE_FACTOR, SendContext, limits_of
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.lifecycle import moves
from dispatcher.lifecycle.states import AttemptState
from dispatcher.policy.breaker import Pause
from dispatcher.policy.ratelimit import LocalLimiter
from dispatcher.sending import record
from dispatcher.sending.send import Outcome, send_notification
from dispatcher.store import queries as store
from dispatcher.store.account import Account
from dispatcher.store.models import Attempt, Payload
from tests.support.dispatcher_setup import drive, example_settings, reminder, send_context
from tests.support.sandbox_process import SandboxProcess

ACCOUNT = Account("default", 1)  # the top-level instance's account 1

pytestmark = pytest.mark.integration


def _accept(ctx: SendContext, request: dict) -> int:
    record = intake.accept(parse_request(request), sessions=ctx.sessions, settings=ctx.settings, enqueuer=ListEnqueuer())
    with ctx.sessions() as session:
        notification = store.find_notification_by_event(session, record.event_id)
        assert notification is not None
        return notification.id


def _calls(sandbox: SandboxProcess) -> dict[str, int]:
    return dict(sandbox.stats()["calls"])


def test_new_contact_takes_four_calls_and_a_known_one_takes_one(context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a contact the workspace has never seen
    first = _accept(context, reminder("evt-new-1", identifier="pat-1", phone="+15550300001"))
    drive(context, first)  # warms the inbox list as well
    before = _calls(sandbox)
    second_contact = _accept(context, reminder("evt-new-2", identifier="pat-2", phone="+15550300002"))
    # When it is sent to, then: search, create contact (with its source_id), create conversation, send
    results = drive(context, second_contact)
    assert results[-1].outcome is Outcome.ACCEPTED
    after = _calls(sandbox)
    spent = {op: after.get(op, 0) - before.get(op, 0) for op in after if after.get(op, 0) != before.get(op, 0)}
    assert spent == {"searchContacts": 1, "createContact": 1, "createConversation": 1, "createMessage": 1}
    # And a second notification to the same contact takes createMessage alone
    again = _accept(context, reminder("evt-new-3", identifier="pat-2", phone="+15550300002"))
    drive(context, again)
    final = _calls(sandbox)
    spent = {op: final.get(op, 0) - after.get(op, 0) for op in final if final.get(op, 0) != after.get(op, 0)}
    assert spent == {"createMessage": 1}
    messages = sandbox.messages()
    assert len({message["conversation_id"] for message in messages if message["contact_id"] == messages[-1]["contact_id"]}) == 1


def test_the_record_holds_the_recommended_values(context: SendContext, sandbox: SandboxProcess) -> None:
    notification_id = _accept(context, reminder("evt-rec", identifier="pat-rec", phone="+15550300010"))
    drive(context, notification_id)
    record = intake.status(context.sessions, "evt-rec")
    sandbox_message = next(m for m in sandbox.messages() if m["id"] == record.message_id)
    assert record.state in {"accepted", "sent", "delivered", "read"}
    assert record.conversation_id == sandbox_message["conversation_id"]
    assert record.inbox_id == sandbox_message["inbox_id"] == 1
    assert record.channel == "messaging_platform"
    assert record.accepted_at is not None
    assert sandbox_message["template_name"] == "appointment_reminder"
    with context.sessions() as session:
        # No fallback route on "reminders"? It has one (sms): the payload stays until the outcome is known.
        assert store.load_payload(session, notification_id) is not None


def test_a_dropped_response_after_commit_is_adopted_not_resent(context: SendContext, sandbox: SandboxProcess) -> None:
    # Given the sandbox commits createMessage and then drops the response, every time
    notification_id = _accept(context, reminder("evt-drop", identifier="pat-drop", phone="+15550300020"))
    sandbox.set_faults({"createMessage": {"drop_response_share": 1.0}})
    # When the send path runs once, the outcome is unknown and it asks to look before resending
    first = send_notification(notification_id, context)
    assert first.outcome is Outcome.RETRY
    with context.sessions() as session:
        assert store.attempts_of(session, notification_id)[0].state == AttemptState.UNKNOWN
    # Then the next run finds the message in the conversation and adopts it: no second send
    sandbox.set_faults({})
    second = send_notification(notification_id, context)
    assert second.outcome is Outcome.ADOPTED
    ours = [m for m in sandbox.messages() if m["id"] == second.message_id]
    assert len(ours) == 1
    assert sum(1 for m in sandbox.messages() if m["conversation_id"] == ours[0]["conversation_id"]) == 1
    assert _calls(sandbox)["createMessage"] == 1


def test_a_known_pair_s_run_after_a_failed_call_asks_for_no_source_id(context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a patient whose conversation is linked (a first reminder went out)
    first = _accept(context, reminder("evt-linked-1", identifier="pat-linked", phone="+15550300031"))
    assert drive(context, first)[-1].outcome is Outcome.ACCEPTED
    # and a second reminder whose first createMessage answered 503 (its next run is not the warm path)
    second = _accept(context, reminder("evt-linked-2", identifier="pat-linked", phone="+15550300031"))
    sandbox.set_faults({"createMessage": {"server_error_share": 1.0}})
    assert send_notification(second, context).outcome is Outcome.RETRY
    sandbox.set_faults({})
    before = _calls(sandbox)
    # When it runs again
    assert drive(context, second)[-1].outcome is Outcome.ACCEPTED
    spent = {op: n - before.get(op, 0) for op, n in _calls(sandbox).items() if n != before.get(op, 0)}
    # Then it lists no inboxes of the contact for a source_id the linked conversation makes needless
    assert "listContactableInboxes" not in spent and "createConversation" not in spent
    assert spent.get("createMessage") == 1


def _lose_the_answer_of_the_first_send(ctx: SendContext, sandbox: SandboxProcess, event_id: str, phone: str) -> int:
    """A notification whose createMessage committed and whose answer never came back."""
    notification_id = _accept(ctx, reminder(event_id, identifier=f"pat-{event_id}", phone=phone))
    sandbox.set_faults({"createMessage": {"drop_response_share": 1.0}})
    assert send_notification(notification_id, ctx).outcome is Outcome.RETRY
    with ctx.sessions() as session:
        assert store.attempts_of(session, notification_id)[0].state == AttemptState.UNKNOWN
    return notification_id


def test_a_look_that_keeps_failing_never_ends_the_attempt_by_its_tries(context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a message that exists although its answer was lost
    notification_id = _lose_the_answer_of_the_first_send(context, sandbox, "evt-look", "+15550300050")
    # When every read of its conversation fails, for more runs than the retry limit allows tries
    sandbox.set_faults({"listMessages": {"server_error_share": 1.0}})
    for _ in range(context.plan.max_tries + 2):
        result = send_notification(notification_id, context)
        assert result.outcome is Outcome.RETRY, result.reason
        assert "looking for an earlier try's message" in result.reason
    with context.sessions() as session:
        attempt = store.attempts_of(session, notification_id)[0]
        assert attempt.state == AttemptState.UNKNOWN
        assert attempt.tries == context.plan.max_tries  # each failed read is a try, never counted past the limit
    # Then the attempt neither failed nor fell back (a fallback would be a second message), and
    # once the conversation can be read the message is adopted
    assert intake.status(context.sessions, "evt-look").fallback_decision is None
    sandbox.set_faults({})
    assert send_notification(notification_id, context).outcome is Outcome.ADOPTED
    assert intake.status(context.sessions, "evt-look").fallback_decision is None
    assert _calls(sandbox)["createMessage"] == 1


def test_a_look_that_fails_past_the_send_deadline_ends_as_outcome_unknown_without_a_fallback(
    context: SendContext, sandbox: SandboxProcess
) -> None:
    notification_id = _lose_the_answer_of_the_first_send(context, sandbox, "evt-look-late", "+15550300051")
    sandbox.set_faults({"listMessages": {"server_error_share": 1.0}})
    real_clock = context.clock
    context.clock = lambda: real_clock() + timedelta(seconds=context.settings.send_deadline_s + 60)
    result = send_notification(notification_id, context)
    sandbox.set_faults({})
    assert result.outcome is Outcome.FAILED
    record = intake.status(context.sessions, "evt-look-late")
    assert (record.state, record.error_kind, record.fallback_decision) == ("failed", "outcome_unknown", "none")
    assert record.error_detail is not None and "could not be read by the send deadline; not sent again" in record.error_detail
    assert _calls(sandbox)["createMessage"] == 1


def test_a_wait_past_the_send_deadline_fails_the_notification_without_a_fallback(
    context: SendContext, sandbox: SandboxProcess
) -> None:
    # Given a reminder with an SMS fallback whose run finds our own limiter saying "not now"
    notification_id = _accept(context, reminder("evt-wait-late", identifier="pat-wait-late", phone="+15550300053"))
    context.limiter.pause(3600)
    # When that run comes past the notification's send deadline
    real_clock = context.clock
    context.clock = lambda: real_clock() + timedelta(seconds=context.settings.send_deadline_s + 60)
    result = send_notification(notification_id, context)
    # Then it fails, saying why, and no route sends it any more: the deadline is the notification's
    assert result.outcome is Outcome.FAILED
    record = intake.status(context.sessions, "evt-wait-late")
    assert (record.state, record.error_kind, record.fallback_decision) == ("failed", "send_deadline", "none")
    assert record.error_detail is not None and "past the send deadline" in record.error_detail
    assert _calls(sandbox).get("createMessage", 0) == 0


def test_a_route_s_own_cap_holds_back_its_sends_past_the_cap(
    sandbox: SandboxProcess, tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    # Given two SMS notifications handed over, then the SMS route capped at one message a minute
    # (intake counts only hand-overs: the send path's own bucket holds the cap also for what intake
    # did not count, a fallback onto the route or a cap set since)
    sandbox.reset()
    database_url = f"sqlite:///{tmp_path}/cap.sqlite"
    with send_context(example_settings(api_url=sandbox.base_url, database_url=database_url)) as ctx:
        sms = [_accept(ctx, {"event_id": f"evt-cap-{n}", "route": "sms", "content": "Your appointment is tomorrow",
                             "contact": {"identifier": f"pat-cap-{n}", "phone_number": f"+1555030006{n}"}})
               for n in (1, 2)]
    routes = example_settings(api_url="http://x").model_dump()["routes"]
    routes["sms"]["max_per_minute"] = 1
    with send_context(example_settings(api_url=sandbox.base_url, database_url=database_url, routes=routes)) as ctx:
        # When both are sent within the minute
        first, second = (send_notification(notification_id, ctx) for notification_id in sms)
    # Then the first goes out and the second waits for the route's cap, not calling createMessage
    assert first.outcome is Outcome.ACCEPTED
    assert second.outcome is Outcome.RETRY and second.delay_s is not None and second.delay_s > 0
    assert _calls(sandbox).get("createMessage", 0) == 1


def test_a_refused_token_pauses_the_workspace_once_counted_by_its_reason_and_the_notification_waits(
    sandbox: SandboxProcess, tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    sandbox.reset()
    settings = example_settings(api_url=sandbox.base_url, database_url=f"sqlite:///{tmp_path}/token.sqlite",
                                api_token="a-token-the-workspace-never-issued-0123456789")
    with send_context(settings) as ctx:
        notification_id = _accept(ctx, reminder("evt-bad-token", identifier="pat-bad-token", phone="+15550300074"))
        paused = REGISTRY.get_sample_value("dispatcher_workspace_pauses_total", {"reason": "auth"}) or 0.0
        result = send_notification(notification_id, ctx)
        again = send_notification(notification_id, ctx)  # the breaker is open: no call, no second pause
        record_now = intake.status(ctx.sessions, "evt-bad-token")
    assert (result.outcome, result.paused, again.outcome) == (Outcome.RETRY, True, Outcome.RETRY)
    assert REGISTRY.get_sample_value("dispatcher_workspace_pauses_total", {"reason": "auth"}) == paused + 1
    assert (record_now.state, record_now.error_kind) == ("queued", "auth")
    assert _calls(sandbox).get("createMessage", 0) == 0


def test_a_workspace_away_holds_a_notification_until_its_send_deadline_then_fails_it_saying_why(
    context: SendContext, sandbox: SandboxProcess
) -> None:
    # Given a reminder, and a workspace that refuses our token (every worker paused, docs/sending.md)
    notification_id = _accept(context, reminder("evt-away", identifier="pat-away", phone="+15550300054"))
    pause = Pause(reason="auth", detail="the workspace refused the API token (401)", until=time.time() + 60)
    # When a run meets the pause within the send deadline: the notification waits, saying why
    waiting = record.wait_for_workspace(notification_id, None, pause, context)
    assert (waiting.outcome, waiting.paused) == (Outcome.RETRY, True)
    record_now = intake.status(context.sessions, "evt-away")
    assert (record_now.state, record_now.error_kind) == ("queued", "auth")
    # And when a run meets it past the deadline: it fails with the pause's reason, and no route sends it
    real_clock = context.clock
    context.clock = lambda: real_clock() + timedelta(seconds=context.settings.send_deadline_s + 60)
    failed = record.wait_for_workspace(notification_id, None, pause, context)
    assert failed.outcome is Outcome.FAILED
    final = intake.status(context.sessions, "evt-away")
    assert (final.state, final.error_kind, final.fallback_decision) == ("failed", "auth", "none")
    assert final.error_detail is not None and "past the send deadline: the workspace refused" in final.error_detail
    assert _calls(sandbox).get("createMessage", 0) == 0


def test_a_stored_payload_that_cannot_be_read_fails_the_attempt_once_without_a_fallback(
    context: SendContext, sandbox: SandboxProcess
) -> None:
    notification_id = _accept(context, reminder("evt-damaged", identifier="pat-damaged", phone="+15550300052"))
    with context.sessions.begin() as session:  # written by another version, or damaged
        session.execute(sa.update(Payload).where(Payload.notification_id == notification_id)
                        .values(body={"contact": {"identifier": "pat-damaged"}}))
    result = send_notification(notification_id, context)
    assert result.outcome is Outcome.FAILED
    record = intake.status(context.sessions, "evt-damaged")
    assert (record.state, record.error_kind, record.fallback_decision) == ("failed", "payload_unreadable", "none")
    assert _calls(sandbox).get("createMessage", 0) == 0


def test_a_worker_killed_mid_call_leaves_an_expired_lease_that_is_recovered(
    context: SendContext, sandbox: SandboxProcess
) -> None:
    # Given a send that reached the service, but whose worker died before recording it
    notification_id = _accept(context, reminder("evt-kill", identifier="pat-kill", phone="+15550300030"))
    drive(context, notification_id)
    with context.sessions.begin() as session:
        attempt = store.attempts_of(session, notification_id)[0]
        message_id = attempt.message_id
        session.get(Attempt, attempt.id).state = AttemptState.IN_FLIGHT  # type: ignore[union-attr]
        session.get(Attempt, attempt.id).message_id = None  # type: ignore[union-attr]
        session.get(Attempt, attempt.id).content_hash = store.content_hash(  # type: ignore[union-attr]
            parse_request(reminder("evt-kill", identifier="pat-kill", phone="+15550300030")).content
        )
        session.get(Attempt, attempt.id).lease_until = context.clock()  # type: ignore[union-attr]
        notification = store.load_notification(session, notification_id)
        notification.state = "sending"  # type: ignore[union-attr]
    # When the redelivered task runs
    result = send_notification(notification_id, context)
    # Then it adopts the message that exists instead of sending another
    assert result.outcome is Outcome.ADOPTED
    assert result.message_id == message_id
    assert _calls(sandbox)["createMessage"] == 1


def test_a_live_lease_makes_a_twin_wait(context: SendContext, sandbox: SandboxProcess) -> None:
    notification_id = _accept(context, reminder("evt-lease", identifier="pat-lease", phone="+15550300040"))
    with context.sessions.begin() as session:
        attempt = moves.open_attempt(session, notification_id=notification_id, number=1, route="reminders",
                                     channel="messaging_platform", now=context.clock())
        target = moves.Target(inbox_id=1, contact_id=1, conversation_id=1, channel="messaging_platform", content_hash="x")
        assert moves.claim(session, notification_id=notification_id, attempt_id=attempt.id, fallback=False, target=target,
                           now=context.clock(), lease_until=context.clock().replace(year=2100), seen_claims=0)
    for _ in range(context.plan.max_tries + 1):  # twins, redelivered while the lease runs
        result = send_notification(notification_id, context)
        assert result.outcome is Outcome.RETRY
        assert "may still be running" in result.reason
    assert _calls(sandbox).get("createMessage", 0) == 0
    with context.sessions() as session:  # they made no call and ended: no try, and only the claiming run's run
        attempt = store.attempts_of(session, notification_id)[0]
        assert (attempt.tries, attempt.runs) == (0, 1)


def test_server_errors_on_search_are_retried_then_succeed(context: SendContext, sandbox: SandboxProcess) -> None:
    notification_id = _accept(context, reminder("evt-5xx", identifier="pat-5xx", phone="+15550300050"))
    sandbox.set_faults({"searchContacts": {"server_error_share": 1.0}})
    first = send_notification(notification_id, context)
    assert first.outcome is Outcome.RETRY and first.delay_s > 0
    sandbox.set_faults({})
    assert drive(context, notification_id)[-1].outcome is Outcome.ACCEPTED
    assert len(sandbox.messages()) == 1


def test_a_rate_limit_answer_pauses_the_limiter(context: SendContext, sandbox: SandboxProcess) -> None:
    notification_id = _accept(context, reminder("evt-429", identifier="pat-429", phone="+15550300060"))
    sandbox.set_faults({"searchContacts": {"rate_limit_share": 1.0}})
    # the limiter's clock stands still, so both pauses are read as they were set (on a loaded
    # machine the time the run spends after the pause would otherwise count twice in the reads')
    context.limiter = LocalLimiter(limits_of(context.settings), clock=lambda: 1_000.0)
    result = send_notification(notification_id, context)
    assert result.outcome is Outcome.RETRY
    sends_s, reads_s = context.limiter.paused_for(), context.limiter.paused_for(READS_BUCKET)
    assert sends_s > 0  # every worker sharing the limiter now waits
    assert reads_s == pytest.approx(READS_PAUSE_FACTOR * sends_s)  # the status reads longer: sends resume first


def test_limiter_waits_do_not_use_up_the_tries(context: SendContext, sandbox: SandboxProcess) -> None:
    # Given every worker paused by the limiter (another worker's 429), longer than a run sleeps through
    notification_id = _accept(context, reminder("evt-paused", identifier="pat-paused", phone="+15550300061"))
    context.limiter.pause(600)
    # When the notification's task comes back more often than the retry limit allows tries
    results = [send_notification(notification_id, context) for _ in range(context.plan.max_tries + 3)]
    # Then every run waits, none fails, and no try was used: no call was made
    assert {result.outcome for result in results} == {Outcome.RETRY}
    assert all("rate limit" in result.reason for result in results)
    with context.sessions() as session:
        [attempt] = store.attempts_of(session, notification_id)
        assert (attempt.state, attempt.tries) == (AttemptState.QUEUED, 0)
    assert _calls(sandbox).get("createMessage", 0) == 0


@pytest.mark.parametrize(("route", "inbox_id"), [("reminders", 1), ("sms", 2)])
def test_a_conversation_the_workspace_no_longer_has_is_resolved_again_and_sent_once(
    context: SendContext, sandbox: SandboxProcess, route: str, inbox_id: int
) -> None:
    # Given a conversation the store remembers but the workspace no longer has (an agent deleted it)
    request = reminder("evt-gone", identifier=f"pat-gone-{route}", phone=f"+155503000{inbox_id}9", route=route)
    first = _accept(context, request)
    drive(context, first)
    second = _accept(context, {**request, "event_id": "evt-gone-b", "content": "Reminder evt-gone-b: tomorrow"})
    with context.sessions.begin() as session:
        contact_id = store.attempts_of(session, first)[0].contact_id or 0
        link = store.conversation_link(session, account=ACCOUNT, contact_id=contact_id, inbox_id=inbox_id)
        assert link is not None
        link.conversation_id = 999_999
    # When it is sent
    results = drive(context, second)
    # Then the 404 makes it forget the stored ids once, look the contact up again, and send, once
    assert [r.outcome for r in results] == [Outcome.RETRY, Outcome.ACCEPTED]
    assert "resolving again" in results[0].reason
    record = intake.status(context.sessions, "evt-gone-b")
    assert record.error_kind is None and record.fallback_decision is None
    assert record.conversation_id not in (None, 999_999) and record.attempts[0].route == route
    sent = [m for m in sandbox.messages() if (m["content"] or "").startswith("Reminder evt-gone-b:")]
    assert len(sent) == 1 and sent[0]["conversation_id"] == record.conversation_id


def test_free_text_goes_out_on_sms(context: SendContext, sandbox: SandboxProcess) -> None:
    request = {
        "event_id": "evt-sms",
        "route": "sms",
        "contact": {"identifier": "pat-sms", "phone_number": "+15550300080"},
        "content": "Your results are ready",
    }
    notification_id = _accept(context, request)
    assert drive(context, notification_id)[-1].outcome is Outcome.ACCEPTED
    message = sandbox.messages()[-1]
    assert message["inbox_id"] == 2
    assert message.get("template_name") in (None, "")
    with context.sessions() as session:
        assert store.load_payload(session, notification_id) is None  # no fallback route: dropped at acceptance


def test_a_racing_duplicate_contact_resolves_to_the_existing_one(context: SendContext, sandbox: SandboxProcess) -> None:
    # Given the contact exists in the workspace under a phone, created by someone else
    created = httpx.post(
        f"{sandbox.api_url}/contacts",
        headers=sandbox.headers,
        json={"inbox_id": 1, "name": "Other", "phone_number": "+15550300090"},
    )
    assert created.status_code == 200
    existing_id = created.json()["payload"]["contact"]["id"]
    # When we send with an identifier the workspace does not know, createContact answers 422
    notification_id = _accept(context, reminder("evt-dup", identifier="pat-dup", phone="+15550300090"))
    assert drive(context, notification_id)[-1].outcome is Outcome.ACCEPTED
    # Then the message goes to the existing contact
    assert sandbox.messages()[-1]["contact_id"] == existing_id


def test_a_conversation_claim_left_by_a_dead_worker_is_waited_out_not_polled(
    context: SendContext, sandbox: SandboxProcess
) -> None:
    # Given a worker that claimed the pair's conversation and died before creating it
    first = _accept(context, reminder("evt-claim-1", identifier="pat-claim", phone="+15550300100"))
    drive(context, first)
    second = _accept(context, reminder("evt-claim-2", identifier="pat-claim", phone="+15550300100"))
    now = context.clock()
    with context.sessions.begin() as session:
        contact_id = store.attempts_of(session, first)[0].contact_id or 0
        link = store.conversation_link(session, account=ACCOUNT, contact_id=contact_id, inbox_id=1)
        assert link is not None
        link.conversation_id = None
        link.claimed_until = now + timedelta(seconds=20)
    # When another notification for the pair runs, it waits for the claim to expire, in one step
    result = send_notification(second, context)
    assert result.outcome is Outcome.RETRY
    assert 19 < result.delay_s < 21
    # And once the claim has expired, it creates the conversation itself
    with context.sessions.begin() as session:
        contact_id = store.attempts_of(session, first)[0].contact_id or 0
        link = store.conversation_link(session, account=ACCOUNT, contact_id=contact_id, inbox_id=1)
        assert link is not None
        link.claimed_until = now - timedelta(seconds=1)
    assert drive(context, second)[-1].outcome is Outcome.ACCEPTED


def test_a_second_404_fails_the_notification_as_not_found_without_a_duplicate(
    sandbox: SandboxProcess, tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    # Given a workspace whose createMessage answers 404 whatever the conversation (everything else real)
    forward = httpx.Client(base_url=sandbox.base_url, trust_env=False, timeout=10)

    def workspace(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/messages"):
            return httpx.Response(404, json={"error": "Resource could not be found"})
        answer = forward.request(request.method, request.url.path, params=request.url.params, headers=request.headers,
                                 content=request.content)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    sandbox.reset()
    settings = example_settings(api_url=sandbox.base_url, database_url=f"sqlite:///{tmp_path}/dispatcher.sqlite")
    try:
        with send_context(settings, transport=httpx.MockTransport(workspace)) as ctx:
            notification_id = _accept(ctx, reminder("evt-404", identifier="pat-404", phone="+15550300091"))
            results = drive(ctx, notification_id)
            # Then it is resolved again once, and the second 404 ends it: failed, not_found, said why
            assert [r.outcome for r in results][-1] is Outcome.FAILED
            record = intake.status(ctx.sessions, "evt-404")
            assert record.attempts[0].error_kind == "not_found"
            assert sum(1 for r in results if "again" in r.reason) == 1
    finally:
        forward.close()
    assert sandbox.messages() == []


def test_an_inbox_list_that_always_fails_uses_up_the_tries_and_ends(context: SendContext, sandbox: SandboxProcess) -> None:
    # Given a workspace whose listInboxes answers 503 every time (a fresh process: nothing cached)
    context.inboxes._listed_at = None
    sandbox.set_faults({"listInboxes": {"server_error_share": 1.0}})
    notification_id = _accept(context, reminder("evt-inbox-5xx", identifier="pat-inbox", phone="+15550300093"))
    # When the send runs again and again, then the retry limit holds: it ends, saying why
    results = drive(context, notification_id)
    assert results[-1].outcome is Outcome.FAILED and len(results) == context.plan.max_tries
    record = intake.status(context.sessions, "evt-inbox-5xx")
    assert record.attempts[0].error_kind == "tries_exhausted" and record.attempts[0].tries == context.plan.max_tries
