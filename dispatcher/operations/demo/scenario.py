"""What the demo sends, and the final state it expects for each event."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# The demo's registry knows a French reminder the platform never approved: the platform answers
# 132001, and the single decision records "no fallback" (the template must be fixed, not rerouted).
UNAPPROVED_TEMPLATE = {"name": "appointment_reminder", "language": "fr", "category": "UTILITY", "body_params": 2}


@dataclass(frozen=True)
class Sample:
    event_id: str
    what: str
    request: dict[str, Any]
    expected_state: str
    expected_channel: str
    expected_fallback: str | None  # "fallback", "none" or None (no decision needed)
    expected_kind: str  # how the workspace got it: "template" or "free text"

    def for_run(self, run: int) -> Sample:
        """The same sample under this run's event ID: a later run sends again, to the same patients."""
        if run == 1:
            return self
        event_id = f"{self.event_id}-run{run}"
        return replace(self, event_id=event_id, request={**self.request, "event_id": event_id})


def _reminder(event_id: str, identifier: str, name: str, phone: str, when: str, *, language: str = "en") -> dict[str, Any]:
    return {
        "event_id": event_id,
        "route": "reminders",
        "contact": {"identifier": identifier, "name": name, "phone_number": phone},
        "content": f"Hello {name}, a reminder of your appointment on {when}.",
        "template": {"name": "appointment_reminder", "language": language, "category": "UTILITY",
                     "params": {"1": name, "2": when}},
    }


SAMPLES = (
    Sample("appt-1001", "reminder", _reminder("appt-1001", "patient-1001", "Ana", "+15550301001", "Mon 09:00"),
           "read", "messaging_platform", None, "template"),
    Sample("appt-1002", "reminder", _reminder("appt-1002", "patient-1002", "Ben", "+15550301002", "Tue 10:30"),
           "read", "messaging_platform", None, "template"),
    Sample("appt-1003", "reminder", _reminder("appt-1003", "patient-1003", "Cleo", "+15550301003", "Wed 14:15"),
           "read", "messaging_platform", None, "template"),
    # Not on the platform (the sandbox fails +1555010... with 131026): falls back to SMS, once; delivered.
    Sample("appt-1004", "not on the platform", _reminder("appt-1004", "patient-1004", "Dan", "+15550107004", "Thu 08:45"),
           "delivered", "sms", "fallback", "free text"),  # an SMS is never read
    # A template the platform does not have in French: 132001, no fallback.
    Sample("appt-1005", "template error", _reminder("appt-1005", "patient-1005", "Eve", "+15550301005", "Fri 11:00", language="fr"),
           "failed", "messaging_platform", "none", "template"),
)
DUPLICATE_OF = "appt-1001"  # handed over a second time: the same notification comes back


def reply_samples(run: int) -> tuple[Sample, Sample]:
    """A reminder to a patient who then writes back, and the follow-up that the reply lets go out
    as free text (the platform's 24-hour window). A new patient each run: the window of the last
    run's patient is still open, and this shows it opening."""
    identifier, phone = f"patient-1006-run{run}", f"+155503{60000 + run % 40000:05d}"
    first = _reminder("appt-1006", identifier, "Finn", phone, "Sat 12:00")
    follow_up = {**_reminder("appt-1007", identifier, "Finn", phone, "Sat 12:00"),
                 "content": "Thanks, Finn: we have noted your question and will call you back today."}
    return (
        Sample("appt-1006", "patient replies", first, "read", "messaging_platform", None, "template").for_run(run),
        Sample("appt-1007", "follow-up to the reply", follow_up, "read", "messaging_platform", None, "free text").for_run(run),
    )
