"""Recipients decide, with every part a process: the stock sandbox signs a customer's STOP reply
to the receiver, two consumers record the opt-out, a send worker and beat do the rest; Redis is
the broker, PostgreSQL the store. The host's HTTP controls are called on the receiver's intake.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from dispatcher.errors import InvalidEvent
from tests.integration.recipients.test_opt_outs import MARKETING_TEMPLATE, SEED_RECORDS
from tests.integration.tracking.test_tracking_processes import BEHAVIOUR, stack_factory  # noqa: F401  (a fixture)
from tests.support.sandbox_process import running_sandbox
from tests.support.store_scan import kept_anywhere
from tests.support.worker_process import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SMS_INBOX = 2
TOKEN = "intake-token-for-the-opt-out-test"
PHONE = "+15550910001"
REPLY = " sToP "  # a keyword in a case no log line would hold by chance: the canary of the reply text


def _sms(event_id: str, **extra: Any) -> dict[str, Any]:
    return {"event_id": event_id, "route": "sms", "contact": {"identifier": "opt-person", "phone_number": PHONE},
            "content": f"Reminder {event_id}: your appointment is tomorrow", **extra}


def test_a_stop_reply_stops_waiting_and_new_sms_until_start(stack_factory: Any) -> None:  # noqa: F811
    with running_sandbox(BEHAVIOUR) as sandbox:
        stack = stack_factory(sandbox, DISPATCHER_INTAKE_TOKEN=TOKEN)
        dispatcher = stack.dispatcher
        dispatcher.notify(_sms("proc-0"))
        wait_until(lambda: stack.status("proc-0").message_id is not None, timeout_s=30, what="the first SMS")
        contact_id = next(m["contact_id"] for m in sandbox.messages() if m["id"] == stack.status("proc-0").message_id)
        # 50 reminders scheduled for this person, then the STOP
        send_at = (datetime.now(UTC) + timedelta(seconds=15)).isoformat()
        for n in range(1, 51):
            dispatcher.notify(_sms(f"proc-{n}", send_at=send_at))
        sandbox.incoming(contact_id=contact_id, inbox_id=SMS_INBOX, content=REPLY)
        wait_until(lambda: dispatcher.is_suppressed({"phone_number": PHONE}, channel="sms"), timeout_s=30,
                   what="the STOP reply recorded by a consumer")
        assert {stack.status(f"proc-{n}").state for n in range(1, 51)} == {"scheduled"}  # none was due yet
        sent_before = _sms_sent(sandbox, contact_id)

        def all_ended() -> bool:
            stack.group.ensure_running()
            return all(stack.status(f"proc-{n}").state == "failed" for n in range(1, 51))

        wait_until(all_ended, timeout_s=90, what="the 50 scheduled reminders to end")
        ends = {(stack.status(f"proc-{n}").error_kind, stack.status(f"proc-{n}").fallback_decision) for n in range(1, 51)}
        sent_after_stop = _sms_sent(sandbox, contact_id) - sent_before
        print(f"SMS sent after the STOP: {sent_after_stop} of 50")
        assert ends == {("opted_out", "none")}
        assert sent_after_stop == 0

        # WhatsApp to the same person still goes out; SMS again after START
        dispatcher.notify({**_sms("proc-wa"), "route": "reminders", "template": {
            "name": "appointment_reminder", "language": "en", "category": "UTILITY", "params": {"1": "Ana", "2": "9:00"}}})
        wait_until(lambda: stack.status("proc-wa").message_id is not None, timeout_s=30, what="the WhatsApp reminder")
        sandbox.incoming(contact_id=contact_id, inbox_id=SMS_INBOX, content="START")
        wait_until(lambda: not dispatcher.is_suppressed({"phone_number": PHONE}, channel="sms"), timeout_s=30,
                   what="the START reply recorded")
        dispatcher.notify(_sms("proc-after-start"))
        wait_until(lambda: stack.status("proc-after-start").state in ("delivered", "read"), timeout_s=30,
                   what="an SMS after START")

        _http_controls(_base(stack.receiver_url))
        needles = [PHONE, PHONE.lstrip("+"), "opt.person@example.org", "Opt.Person@example.org", REPLY.strip()]
        assert kept_anywhere(dispatcher.sessions, needles) == []
        logs = stack.group.logs()
        assert "opted out" in logs  # the consumer did log the opt-out: the scan below reads real lines
        assert [needle for needle in needles if needle in logs] == []


def _base(receiver_url: str) -> str:
    parts = httpx.URL(receiver_url)
    return f"{parts.scheme}://{parts.host}:{parts.port}"


def _sms_sent(sandbox: Any, contact_id: int) -> int:
    return sum(1 for m in sandbox.messages(contact_id=contact_id) if m["inbox_id"] == SMS_INBOX and m["message_type"] != 0)


def _http_controls(base: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    person = {"recipient": {"email": "Opt.Person@example.org"}, "channel": "email", "category": "marketing"}
    with httpx.Client(base_url=base, headers=headers, timeout=10) as client:
        assert client.post("/v1/recipients/suppress", json=person).json() == {"added": 1}
        assert client.post("/v1/recipients/suppress", json=person).json() == {"added": 0}
        check = {"recipient": {"email": "opt.person@example.org"}, "channel": "email", "category": "marketing"}
        assert client.post("/v1/recipients/check", json=check).json() == {"suppressed": True}
        assert client.post("/v1/recipients/check", json={**check, "category": "service"}).json() == {"suppressed": False}
        assert client.post("/v1/recipients/unsuppress", json=person).json() == {"lifted": 1}
        bad = client.post("/v1/recipients/suppress", json={"recipient": {"phone_number": "5550910002"}})
        assert bad.status_code == 422 and bad.json()["field"] == "recipient.phone_number"
        assert "5550910002" not in bad.text
        assert client.post("/v1/recipients/check", json=check, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.post("/v1/recipients/nothing", json=check).status_code == 404


MARKETING_SANDBOX = SEED_RECORDS.replace(
    "templates = [\n", "templates = [\n" + MARKETING_TEMPLATE, 1) + BEHAVIOUR
TEMPLATES_WITH_MARKETING = [
    {"name": "appointment_reminder", "language": "en", "category": "UTILITY", "body_params": 2},
    {"name": "checkup_offer", "language": "en", "category": "MARKETING", "body_params": 1},
]


def test_provider_opt_outs_and_consent_through_every_process(stack_factory: Any) -> None:  # noqa: F811
    with running_sandbox(MARKETING_SANDBOX) as sandbox:
        stack = stack_factory(sandbox, DISPATCHER_TEMPLATES=json.dumps(TEMPLATES_WITH_MARKETING))
        dispatcher = stack.dispatcher
        sms_person = {"identifier": "p-21610", "phone_number": "+15550910101"}
        wa_person = {"identifier": "p-131050", "phone_number": "+15550910102"}
        dispatcher.notify({"event_id": "pp-0", "route": "sms", "contact": sms_person, "content": "Hello"})
        dispatcher.notify({"event_id": "pp-1", "route": "reminders", "contact": wa_person, "content": "Hello",
                           "template": {"name": "appointment_reminder", "language": "en", "category": "UTILITY",
                                        "params": {"1": "Ana", "2": "9:00"}}})
        for event in ("pp-0", "pp-1"):
            wait_until(lambda: stack.status(event).message_id is not None, timeout_s=30, what=f"{event} sent")
        contacts = {event: next(m["contact_id"] for m in sandbox.messages() if m["id"] == stack.status(event).message_id)
                    for event in ("pp-0", "pp-1")}
        # The providers' own lists, which we never saw being made
        sandbox.client.post("/_sandbox/opt-outs", json={"contact_id": contacts["pp-0"], "sms_opted_out": True})
        sandbox.client.post("/_sandbox/opt-outs", json={"contact_id": contacts["pp-1"], "marketing_opted_out": True})
        dispatcher.notify({"event_id": "pp-2", "route": "sms", "fallback_route": "portal", "contact": sms_person,
                           "content": "Your results are ready"})
        offer = {"event_id": "pp-3", "route": "reminders", "contact": wa_person, "content": "A check-up offer",
                 "template": {"name": "checkup_offer", "language": "en", "category": "MARKETING", "params": {"1": "Ana"}}}
        dispatcher.notify(offer)

        def ended(*events: str) -> bool:
            stack.group.ensure_running()
            return all(stack.status(event).state == "failed" for event in events)

        wait_until(lambda: ended("pp-2", "pp-3"), timeout_s=60, what="both provider refusals applied")
        for event in ("pp-2", "pp-3"):
            record = stack.status(event)
            assert (record.error_kind, record.fallback_decision) == ("opted_out", "none"), event
        assert not [m for m in sandbox.messages() if m["inbox_id"] in (2, 5) and m["contact_id"] == contacts["pp-1"]]
        assert not [m for m in sandbox.messages() if m["inbox_id"] == 5]  # no fallback to the portal either
        # Next time nothing is even tried; a service reminder to the marketing opt-out still goes out
        sent_before = len(sandbox.messages())
        dispatcher.notify({**offer, "event_id": "pp-4"})
        dispatcher.notify({"event_id": "pp-5", "route": "sms", "contact": sms_person, "content": "Hello again"})
        wait_until(lambda: ended("pp-4", "pp-5"), timeout_s=30, what="the next sends refused before any call")
        assert len(sandbox.messages()) == sent_before
        dispatcher.notify({"event_id": "pp-6", "route": "reminders", "contact": wa_person, "content": "Reminder",
                           "template": {"name": "appointment_reminder", "language": "en", "category": "UTILITY",
                                        "params": {"1": "Ana", "2": "10:00"}}})
        wait_until(lambda: stack.status("pp-6").state in ("delivered", "read"), timeout_s=30, what="the service reminder")

        # Web session: refused without consent, sent with it, not sent once it is withdrawn
        web = {"route": "web_session", "contact": {"identifier": "p-web", "phone_number": "+15550910103"},
               "content": "Your visit is confirmed"}
        with pytest.raises(InvalidEvent) as refused:
            dispatcher.notify({**web, "event_id": "web-0"})
        assert refused.value.field == "consent_ref"
        dispatcher.notify({**web, "event_id": "web-1", "consent_ref": "portal-consent-2026-5"})
        wait_until(lambda: stack.status("web-1").message_id is not None, timeout_s=30, what="the consented send")
        later = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
        dispatcher.notify({**web, "event_id": "web-2", "send_at": later})  # consent on record: accepted
        dispatcher.withdraw_consent({"identifier": "p-web"})
        assert stack.status("web-2").state == "scheduled"  # withdrawn before it was due
        wait_until(lambda: ended("web-2"), timeout_s=60, what="the scheduled web-session send to end")
        assert stack.status("web-2").error_kind == "no_consent"
        assert kept_anywhere(dispatcher.sessions, ["+15550910101", "+15550910102", "+15550910103",
                                                   "portal-consent-2026-5"]) == []
