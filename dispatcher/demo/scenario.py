"""What the demo sends, and the final state it expects for each event."""

from __future__ import annotations

from dataclasses import dataclass
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
           "read", "messaging_platform", None),
    Sample("appt-1002", "reminder", _reminder("appt-1002", "patient-1002", "Ben", "+15550301002", "Tue 10:30"),
           "read", "messaging_platform", None),
    Sample("appt-1003", "reminder", _reminder("appt-1003", "patient-1003", "Cleo", "+15550301003", "Wed 14:15"),
           "read", "messaging_platform", None),
    # Not on the platform (the sandbox fails +1555010... with 131026): falls back to SMS, once.
    Sample("appt-1004", "not on the platform", _reminder("appt-1004", "patient-1004", "Dan", "+15550107004", "Thu 08:45"),
           "read", "sms", "fallback"),
    # A template the platform does not have in French: 132001, no fallback.
    Sample("appt-1005", "template error", _reminder("appt-1005", "patient-1005", "Eve", "+15550301005", "Fri 11:00", language="fr"),
           "failed", "messaging_platform", "none"),
)
DUPLICATE_OF = "appt-1001"  # handed over a second time: the same notification comes back
