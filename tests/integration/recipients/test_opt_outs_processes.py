"""Recipients decide, with every part a process: the stock sandbox signs a customer's STOP reply
to the receiver, two consumers record the opt-out, a send worker and beat do the rest; Redis is
the broker, PostgreSQL the store. The host's HTTP controls are called on the receiver's intake.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.integration.tracking.test_tracking_processes import BEHAVIOUR, stack_factory  # noqa: F401  (a fixture)
from tests.support.sandbox_process import running_sandbox
from tests.support.store_scan import kept_anywhere
from tests.support.worker_process import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SMS_INBOX = 2
TOKEN = "intake-token-for-the-opt-out-test"
PHONE = "+15550910001"


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
        sandbox.incoming(contact_id=contact_id, inbox_id=SMS_INBOX, content="Stop")
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
        assert kept_anywhere(dispatcher.sessions, [PHONE, PHONE.lstrip("+"), "opt.person@example.org"]) == []


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
