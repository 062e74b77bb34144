"""No error answer and no log line of the HTTP intake repeats a phone number, an e-mail address,
a name, the content or the token; the log carries the event ID, the status and the field only."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatcher.intake.http import _safe_field
from tests.unit.http_intake.conftest import AUTH, CONTENT, EMAIL, NAME, PATH, PHONE, TOKEN, Intake, valid_request

SECRETS = (PHONE, PHONE.removeprefix("+"), EMAIL, NAME, CONTENT, CONTENT[:20], TOKEN)

# Each sends the patient's data in a request that is refused (or accepted, for the log check).
ATTEMPTS: list[tuple[str, Any, dict[str, str] | None]] = [
    ("accepted", valid_request("priv-ok"), None),
    ("repeat", valid_request("priv-ok"), None),
    ("conflict", valid_request("priv-ok", content=CONTENT + " (changed)"), None),
    ("unknown route", valid_request("priv-1", route="pigeons"), None),
    ("bad phone", valid_request("priv-2", contact__phone_number=PHONE + "x"), None),
    ("bad e-mail", valid_request("priv-3", contact__email=EMAIL.replace("@", " at ")), None),
    ("free text", valid_request("priv-4", template=...), None),
    ("too long", valid_request("priv-5", content=CONTENT * 80), None),
    ("past", valid_request("priv-6", send_at=(datetime.now(UTC) - timedelta(days=1)).isoformat()), None),
    ("phone as a key", {**valid_request("priv-7"), PHONE: CONTENT}, None),
    ("content as a metadata key", valid_request("priv-8", metadata={CONTENT * 2: PHONE}), None),
    ("phone as a params key", valid_request("priv-9", template__params={"1": NAME, PHONE: "x"}), None),
    ("metadata value too long", valid_request("priv-10", metadata={"note": CONTENT * 5}), None),
    ("not an object", [PHONE, CONTENT], None),
    ("event_id is the content", valid_request(CONTENT), None),
    ("wrong token", valid_request("priv-11"), {"Authorization": "Bearer " + PHONE}),
]


def test_no_answer_or_log_line_repeats_personal_data(intake: Intake, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    answers = []
    for _name, body, headers in ATTEMPTS:
        answers.append(intake.post(body, headers=headers))
    for raw in (b'{"event_id": "priv-12", "content": "' + CONTENT.encode() + b'", ',):
        answers.append(intake.client.post(PATH, content=raw, headers={**AUTH, "Content-Type": "application/json"}))
    answers.append(intake.client.post(PATH, content=CONTENT.encode(), headers={**AUTH, "Content-Type": "text/plain"}))
    answers.append(intake.client.get(f"{PATH}/{PHONE}", headers=AUTH))

    statuses = [answer.status_code for answer in answers]
    assert statuses == [202, 202, 409, 422, 422, 422, 422, 422, 422, 422, 422, 422, 422, 422, 422, 401, 400, 415, 404]
    errors = [answer.text for answer in answers if answer.status_code >= 400]
    assert len(errors) == 17
    for text in errors:
        for secret in SECRETS:
            assert secret not in text, (secret, text)
    log_text = "\n".join(f"{record.name} {record.getMessage()}" for record in caplog.records)
    for secret in SECRETS:
        assert secret not in log_text, (secret, log_text)


def test_the_log_names_the_event_the_status_and_the_field(intake: Intake, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dispatcher.intake.http")
    intake.post(valid_request("log-1"))
    intake.post(valid_request("log-2", route="pigeons"))
    intake.post(valid_request("log-3"), headers={})

    messages = [record.getMessage() for record in caplog.records if record.name == "dispatcher.intake.http"]
    assert messages == [
        "intake log-1 accepted: queued (202)",
        "intake log-2 refused: 422 invalid_request (field route)",
        "intake - refused: 401 unauthorized (field authorization)",  # no event ID before authentication
    ]


def test_the_field_of_an_unknown_key_that_is_not_a_plain_name_is_masked(intake: Intake) -> None:
    assert _safe_field("metadata.appointment") == "metadata.appointment"
    assert _safe_field("template.params.1") == "template.params.1"
    assert _safe_field("colour") == "colour"
    assert _safe_field(PHONE) == "*"
    assert _safe_field(f"metadata.{EMAIL}") == "metadata.*"  # the address has dots: no piece of it shows
    assert _safe_field(f"template.params.{PHONE}") == "template.params.*"
    assert _safe_field(f"contact.{CONTENT}") == "contact.*"

    response = intake.post({**valid_request("mask-1"), PHONE: "x"})
    assert response.status_code == 422
    assert response.json()["field"] == "*"
