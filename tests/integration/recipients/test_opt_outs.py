"""Recipients decide (issue 19), against a real sandbox process in its stock profile: STOP and
START replies, the providers' opt-out codes (21610, 131050), categories, web-session consent,
and the host's controls. The send and tracking code runs in this process, as a worker and the
consumer run it; tests/integration/recipients/test_opt_outs_processes.py runs every part as its
own process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from prometheus_client import REGISTRY

from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import InvalidEvent
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.operations.cli.main import cli
from dispatcher.recipients.controls import Recipients
from dispatcher.recipients.keywords import vocabulary
from dispatcher.sending.send import Outcome
from dispatcher.store import queries as store
from dispatcher.store.models import Suppression
from dispatcher.tracking.outcomes import apply_event
from dispatcher.tracking.webhooks.events import EventSummary, summarize
from tests.support.dispatcher_setup import drive, example_settings, reminder, send_context
from tests.support.sandbox_process import REPO_ROOT, SandboxProcess, running_sandbox
from tests.support.store_scan import kept_anywhere

pytestmark = pytest.mark.integration

SMS_INBOX, PLATFORM_INBOX, WEB_SESSION_INBOX = 2, 1, 4
# The stock seed, whose platform inbox also approved a marketing template.
SEED = (REPO_ROOT / "sandbox" / "seed.default.toml").read_text()
MARKETING_TEMPLATE = '  { name = "checkup_offer", language = "en", category = "MARKETING", body_params = 1 },\n'
SEED_RECORDS = SEED[:SEED.index("\n[behaviour]")]  # accounts, tokens, inboxes, contacts, rules
SANDBOX = SEED_RECORDS.replace("templates = [\n", "templates = [\n" + MARKETING_TEMPLATE, 1) + """
[behaviour]
delivered_after_s = 0.05
read_after_s = 0.05
failed_after_s = 0.05
"""
TEMPLATES = [
    {"name": "appointment_reminder", "language": "en", "category": "UTILITY", "body_params": 2},
    {"name": "checkup_offer", "language": "en", "category": "MARKETING", "body_params": 1},
]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with running_sandbox(SANDBOX) as process:
        yield process


@pytest.fixture()
def context(sandbox: SandboxProcess, tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Iterator[SendContext]:
    sandbox.reset()
    settings = example_settings(api_url=sandbox.base_url, database_url=f"sqlite:///{tmp_path}/recipients.sqlite",
                                templates=TEMPLATES)
    with send_context(settings) as ctx:
        ctx.enqueuer = ListEnqueuer()
        yield ctx


def _sms(event_id: str, phone: str, **extra: Any) -> dict[str, Any]:
    return {"event_id": event_id, "route": "sms", "contact": {"identifier": f"id-{phone}", "phone_number": phone},
            "content": "Your appointment is tomorrow at 09:00", **extra}


def _accept(ctx: SendContext, request: dict[str, Any]) -> int:
    record = intake.accept(parse_request(request), sessions=ctx.sessions, settings=ctx.settings, enqueuer=ListEnqueuer())
    with ctx.sessions() as session:
        notification = store.find_notification_by_event(session, record.event_id)
        assert notification is not None
        return notification.id


def _send(ctx: SendContext, request: dict[str, Any]) -> Outcome:
    return drive(ctx, _accept(ctx, request))[-1].outcome


def _outgoing(sandbox: SandboxProcess, **filters: Any) -> list[dict[str, Any]]:
    return [m for m in sandbox.messages(**filters) if m["message_type"] != 0]


def _reply(sandbox: SandboxProcess, ctx: SendContext, *, contact_id: int, inbox_id: int, text: str) -> str:
    """A customer's reply, through the sandbox, summarised from the payload the sandbox would sign
    (as the receiver does) and applied (as the consumer does)."""
    sent = sandbox.incoming(contact_id=contact_id, inbox_id=inbox_id, content=text)
    payload = {"event": "message_created", "id": sent["message"]["id"], "message_type": "incoming", "content": text,
               "inbox": {"id": inbox_id}, "conversation": {"id": sent["conversation_id"]},
               "sender": {"id": contact_id, "phone_number": None}}
    summary = summarize(payload, reply_words=vocabulary(ctx.settings.routes.values()), hashing_key=ctx.settings.hashing_key)
    assert summary is not None
    return apply_event(summary, ctx, ctx.enqueuer)


def _contact_of(sandbox: SandboxProcess, event_id: str, ctx: SendContext) -> int:
    record = intake.status(ctx.sessions, event_id)
    message = next(m for m in sandbox.messages() if m["id"] == record.message_id)
    return int(message["contact_id"])


def test_stop_on_sms_stops_sms_but_not_whatsapp_and_start_lifts_it(sandbox: SandboxProcess, context: SendContext) -> None:
    phone = "+15550900001"
    assert _send(context, _sms("stop-1", phone)) is Outcome.ACCEPTED
    contact_id = _contact_of(sandbox, "stop-1", context)
    assert _reply(sandbox, context, contact_id=contact_id, inbox_id=SMS_INBOX, text="  stop ") == "opted_out"

    before = len(_outgoing(sandbox))
    assert _send(context, _sms("stop-2", phone)) is Outcome.FAILED
    record = intake.status(context.sessions, "stop-2")
    assert (record.state, record.error_kind) == ("failed", "opted_out")
    assert record.fallback_decision == "none"
    assert len(_outgoing(sandbox)) == before  # no createMessage at all

    whatsapp = reminder("stop-3", identifier=f"id-{phone}", phone=phone)
    assert _send(context, whatsapp) is Outcome.ACCEPTED  # the STOP was on SMS only

    assert _reply(sandbox, context, contact_id=contact_id, inbox_id=SMS_INBOX, text="START") == "opted_in"
    assert _send(context, _sms("stop-4", phone)) is Outcome.ACCEPTED


def test_a_stop_from_a_sender_we_cannot_name_is_counted_and_suppresses_no_one(context: SendContext) -> None:
    # a STOP on the SMS inbox from a contact no send of ours ever reached, with no phone number
    payload = {"event": "message_created", "id": 7001, "message_type": "incoming", "content": "STOP",
               "inbox": {"id": SMS_INBOX}, "conversation": {"id": 7001}, "sender": {"id": 987_654, "phone_number": None}}
    summary = summarize(payload, reply_words=vocabulary(context.settings.routes.values()),
                        hashing_key=context.settings.hashing_key)
    assert summary is not None
    unmatched = REGISTRY.get_sample_value("dispatcher_opt_outs_total", {"change": "unmatched", "source": "keyword"}) or 0.0
    assert apply_event(summary, context, context.enqueuer) == "ignored_reply_unknown_sender"
    assert REGISTRY.get_sample_value("dispatcher_opt_outs_total", {"change": "unmatched", "source": "keyword"}) == unmatched + 1
    with context.sessions() as session:
        assert session.scalars(sa.select(Suppression)).all() == []


def test_a_sentence_with_stop_in_it_is_not_an_opt_out(sandbox: SandboxProcess, context: SendContext) -> None:
    phone = "+15550900002"
    assert _send(context, _sms("talk-1", phone)) is Outcome.ACCEPTED
    contact_id = _contact_of(sandbox, "talk-1", context)
    text = "Please don't stop the reminders"
    assert _reply(sandbox, context, contact_id=contact_id, inbox_id=SMS_INBOX, text=text) == "window_opened"
    assert _send(context, _sms("talk-2", phone)) is Outcome.ACCEPTED
    assert kept_anywhere(context.sessions, [text, "don't stop", phone]) == []


def test_many_waiting_notifications_are_not_sent_after_a_stop(sandbox: SandboxProcess, context: SendContext) -> None:
    phone = "+15550900003"
    assert _send(context, _sms("many-0", phone)) is Outcome.ACCEPTED
    contact_id = _contact_of(sandbox, "many-0", context)
    waiting = [_accept(context, _sms(f"many-{n}", phone)) for n in range(1, 51)]  # queued before the STOP
    assert _reply(sandbox, context, contact_id=contact_id, inbox_id=SMS_INBOX, text="STOP") == "opted_out"
    before = len(_outgoing(sandbox, contact_id=contact_id))
    outcomes = [drive(context, notification_id)[-1].outcome for notification_id in waiting]
    assert outcomes == [Outcome.FAILED] * 50
    assert len(_outgoing(sandbox, contact_id=contact_id)) == before
    states = {(r.state, r.error_kind) for r in (intake.status(context.sessions, f"many-{n}") for n in range(1, 51))}
    assert states == {("failed", "opted_out")}


def _platform_opt_outs() -> float:
    return REGISTRY.get_sample_value("dispatcher_opt_outs_total", {"change": "opted_out", "source": "platform"}) or 0.0


def test_21610_records_the_opt_out_and_neither_falls_back_nor_retries(sandbox: SandboxProcess,
                                                                       context: SendContext) -> None:
    phone = "+15550900004"
    # The person replied STOP to the SMS provider, which we never saw: the provider refuses the send.
    assert _send(context, _sms("p21610-0", phone)) is Outcome.ACCEPTED
    contact_id = _contact_of(sandbox, "p21610-0", context)
    sandbox.client.post("/_sandbox/opt-outs", json={"contact_id": contact_id, "sms_opted_out": True}).raise_for_status()

    assert _send(context, _sms("p21610-1", phone, fallback_route="portal")) is Outcome.ACCEPTED
    recorded = _platform_opt_outs()
    assert _provider_failure(sandbox, context, "p21610-1", code="21610") == "no_fallback"
    assert _platform_opt_outs() == recorded + 1  # counted as the provider's, once
    record = intake.status(context.sessions, "p21610-1")
    assert (record.state, record.error_kind, record.fallback_decision) == ("failed", "opted_out", "none")
    assert context.enqueuer.sent == []  # type: ignore[attr-defined]  # no fallback queued
    assert not _outgoing(sandbox, inbox_id=5)  # nothing on the portal route

    assert Recipients(context.sessions, context.settings).is_suppressed({"phone_number": phone}, channel="sms")
    assert _send(context, _sms("p21610-2", phone)) is Outcome.FAILED  # now refused before any call
    assert intake.status(context.sessions, "p21610-2").error_kind == "opted_out"


def test_131050_stops_marketing_only(sandbox: SandboxProcess, context: SendContext) -> None:
    phone = "+15550900005"
    service = reminder("mkt-0", identifier="mkt-person", phone=phone)
    assert _send(context, service) is Outcome.ACCEPTED
    contact_id = _contact_of(sandbox, "mkt-0", context)
    sandbox.client.post("/_sandbox/opt-outs", json={"contact_id": contact_id, "marketing_opted_out": True}).raise_for_status()

    offer = reminder("mkt-1", identifier="mkt-person", phone=phone,
                     template={"name": "checkup_offer", "language": "en", "category": "MARKETING", "params": {"1": "Ana"}})
    assert _send(context, offer) is Outcome.ACCEPTED
    # the reminders route falls back to SMS, but not for this failure
    assert _provider_failure(sandbox, context, "mkt-1", code="131050") == "no_fallback"
    assert intake.status(context.sessions, "mkt-1").error_kind == "opted_out"

    before = len(_outgoing(sandbox, contact_id=contact_id))
    second_offer = {**offer, "event_id": "mkt-2"}
    assert _send(context, second_offer) is Outcome.FAILED
    assert len(_outgoing(sandbox, contact_id=contact_id)) == before
    assert _send(context, {**service, "event_id": "mkt-3"}) is Outcome.ACCEPTED  # service still goes out


def test_web_session_needs_consent(sandbox: SandboxProcess, context: SendContext) -> None:
    phone = "+15550900006"
    request = {"event_id": "ws-0", "route": "web_session", "content": "Your visit is confirmed",
               "contact": {"identifier": "ws-person", "phone_number": phone}}
    with pytest.raises(InvalidEvent) as refused:
        _accept(context, request)
    assert refused.value.field == "consent_ref"
    assert phone not in str(refused.value)

    assert _send(context, {**request, "event_id": "ws-1", "consent_ref": "consent-form-77"}) is Outcome.ACCEPTED
    waiting = _accept(context, {**request, "event_id": "ws-2"})  # consent is on record now
    recipients = Recipients(context.sessions, context.settings)
    assert recipients.withdraw_consent({"identifier": "ws-person"}) == 1
    before = len(_outgoing(sandbox))
    assert drive(context, waiting)[-1].outcome is Outcome.FAILED
    record = intake.status(context.sessions, "ws-2")
    assert (record.state, record.error_kind) == ("failed", "no_consent")
    assert len(_outgoing(sandbox)) == before
    assert kept_anywhere(context.sessions, ["consent-form-77", phone]) == []


def test_host_controls_are_idempotent_and_keep_an_audit(sandbox: SandboxProcess, context: SendContext) -> None:
    recipients = Recipients(context.sessions, context.settings)
    ana = {"phone_number": "+15550900007", "email": "Ana@Example.com"}
    assert recipients.suppress(ana, channel="email") == 2
    assert recipients.suppress(ana, channel="email") == 0
    assert recipients.is_suppressed({"email": "ana@example.com"}, channel="email")  # e-mail in any case
    assert not recipients.is_suppressed(ana, channel="sms")
    listed = recipients.list(ana)
    assert {(r.channel, r.category, r.reason) for r in listed} == {("email", "*", "host")}
    assert recipients.unsuppress(ana, channel="email") == 2
    assert recipients.unsuppress(ana, channel="email") == 0
    assert recipients.list(ana) == []
    assert kept_anywhere(context.sessions, ["+15550900007", "Ana@Example.com", "ana@example.com"]) == []
    with pytest.raises(InvalidEvent) as bad:
        recipients.suppress({"phone_number": "0155 5090"})
    assert bad.value.field == "recipient.phone_number" and "0155" not in str(bad.value)
    with pytest.raises(InvalidEvent) as bad_scope:
        recipients.suppress(ana, channel="pigeon")
    assert bad_scope.value.field == "channel"


def test_the_cli_adds_lists_imports_and_removes(context: SendContext, tmp_path: Path,
                                                clean_environment: pytest.MonkeyPatch) -> None:
    from dispatcher import service

    service._default = service.Dispatcher(context.settings, enqueuer=ListEnqueuer())
    try:
        runner = CliRunner()
        added = runner.invoke(cli, ["suppressions", "add", "--phone", "+15550900008", "--channel", "sms"])
        assert added.exit_code == 0, added.output
        assert '"added": 1' in added.output
        listed = runner.invoke(cli, ["suppressions", "list"])
        assert listed.exit_code == 0 and "sms" in listed.output and "+1555" not in listed.output
        csv_file = tmp_path / "opt-outs.csv"
        csv_file.write_text("phone_number,channel,category\n+15550900009,sms,\n+15550900010,,marketing\n")
        imported = runner.invoke(cli, ["suppressions", "import", str(csv_file)])
        assert imported.exit_code == 0, imported.output
        assert '"rows": 2' in imported.output and '"added": 2' in imported.output
        bad_file = tmp_path / "bad.csv"
        bad_file.write_text("phone_number\n+15550900011\n5550900012\n")
        refused = runner.invoke(cli, ["suppressions", "import", str(bad_file)])
        assert refused.exit_code == 2 and "row 3" in refused.output and "5550900012" not in refused.output
        assert not Recipients(context.sessions, context.settings).is_suppressed({"phone_number": "+15550900011"},
                                                                                channel="sms")  # all or nothing
        removed = runner.invoke(cli, ["suppressions", "remove", "--phone", "+15550900008", "--channel", "sms"])
        assert removed.exit_code == 0 and '"lifted": 1' in removed.output
    finally:
        service._default = None


def _provider_failure(sandbox: SandboxProcess, ctx: SendContext, event_id: str, *, code: str) -> str:
    """Wait for the sandbox to fail the notification's message with ``code``; apply that failure
    as the consumer would, and answer what the consumer made of it."""
    message_id = intake.status(ctx.sessions, event_id).message_id
    assert message_id is not None
    failed = _wait_for_status(sandbox, message_id, "failed")
    assert failed["external_error"].startswith(code)
    summary = EventSummary(event="message_updated", message_id=message_id, status="failed",
                           external_error=failed["external_error"])
    return apply_event(summary, ctx, ctx.enqueuer)


def _wait_for_status(sandbox: SandboxProcess, message_id: int, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        message = next(m for m in sandbox.messages() if m["id"] == message_id)
        if message["status"] == status:
            return message
        time.sleep(0.05)
    raise AssertionError(f"sandbox message {message_id} never became {status}")


def test_a_start_reply_never_lifts_what_the_host_recorded(sandbox: SandboxProcess, context: SendContext) -> None:
    phone = "+15550900012"
    assert _send(context, _sms("host-0", phone)) is Outcome.ACCEPTED
    contact_id = _contact_of(sandbox, "host-0", context)
    assert _reply(sandbox, context, contact_id=contact_id, inbox_id=SMS_INBOX, text="STOP") == "opted_out"
    recipients = Recipients(context.sessions, context.settings)
    assert recipients.suppress({"phone_number": phone}, channel="sms") == 1  # the host's word takes the row over
    assert {r.reason for r in recipients.list({"phone_number": phone})} == {"host"}
    assert _reply(sandbox, context, contact_id=contact_id, inbox_id=SMS_INBOX, text="START") == "opted_in"
    assert recipients.is_suppressed({"phone_number": phone}, channel="sms")
    with pytest.raises(InvalidEvent) as no_channel:
        recipients.is_suppressed({"phone_number": phone}, channel="*")
    assert no_channel.value.field == "channel"
