"""summarize: the payload variants of the field notes, and nothing personal kept."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from dispatcher.policy.fallback import parse_error_code
from dispatcher.tracking.webhooks.events import EventSummary, summarize

from .conftest import CONTENT, PHONE, message_event


def summary(**overrides: Any) -> EventSummary:
    result = summarize(message_event(**overrides))
    assert result is not None
    return result


def test_the_ids_status_and_type_of_a_message_updated_event() -> None:
    got = summary()
    assert got.event == "message_updated"
    assert (got.message_id, got.status, got.message_type, got.private) == (4711, "delivered", "outgoing", False)
    assert (got.conversation_display_id, got.inbox_id, got.account_id, got.contact_id) == (17, 2, 1, 33)
    assert got.created_at == datetime(2026, 5, 28, 20, 26, 40, tzinfo=UTC)
    assert got.external_error is None


def test_status_absent_in_stock_releases_reads_as_none() -> None:
    payload = message_event()
    del payload["status"]
    got = summarize(payload)
    assert got is not None and got.status is None and got.message_id == 4711


@pytest.mark.parametrize(("value", "expected"), [
    ("sent", "sent"), ("DELIVERED", "delivered"), ("read", "read"), ("failed", "failed"),
    (3, "failed"), ("progress", None), (None, None), (True, None), (9, None),
])
def test_status_values(value: Any, expected: str | None) -> None:
    assert summary(status=value).status == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("incoming", "incoming"), ("outgoing", "outgoing"), ("activity", "activity"), ("template", "template"),
    ("Outgoing", "outgoing"), (0, "incoming"), (1, "outgoing"), (2, "activity"), (3, "template"), ("1", "outgoing"),
    (4, None), (-1, None), ("bot", None), (None, None), (False, None), (1.0, None),
])
def test_message_type_as_string_or_integer(value: Any, expected: str | None) -> None:
    assert summary(message_type=value).message_type == expected


def test_external_error_at_the_top_level() -> None:
    assert summary(status="failed", external_error="131026: Message undeliverable").external_error == (
        "131026: Message undeliverable")


def test_external_error_in_content_attributes() -> None:
    got = summary(status="failed", content_attributes={"external_error": "132000: Number of parameters"})
    assert got.external_error == "132000: Number of parameters"


def test_the_top_level_error_wins_and_an_empty_one_falls_through() -> None:
    both = summary(external_error="131026: top", content_attributes={"external_error": "132000: nested"})
    assert both.external_error == "131026: top"
    empty_top = summary(external_error="", content_attributes={"external_error": "132000: nested"})
    assert empty_top.external_error == "132000: nested"


def test_external_error_is_cut_to_200_characters() -> None:
    assert summary(external_error="131026: " + "x" * 500).external_error == ("131026: " + "x" * 500)[:200]


def test_the_conversation_display_id_never_the_contact_inbox_id() -> None:
    payload = message_event()
    payload["conversation"] = {"contact_inbox": {"id": 5003, "contact_id": 33}}  # no display id
    got = summarize(payload)
    assert got is not None and got.conversation_display_id is None
    assert 5003 not in got.model_dump().values()


def test_incoming_contact_is_the_sender() -> None:
    got = summary(event="message_created", message_type="incoming",
                  sender={"id": 44, "name": "Ada", "type": "contact", "phone_number": PHONE})
    assert (got.event, got.message_type, got.contact_id) == ("message_created", "incoming", 44)


def test_outgoing_contact_is_the_conversation_sender() -> None:
    assert summary().contact_id == 33  # sender is the integration user; meta.sender is the contact


def test_contact_from_contact_inbox_when_meta_is_missing() -> None:
    payload = message_event()
    del payload["conversation"]["meta"]
    got = summarize(payload)
    assert got is not None and got.contact_id == 33


def test_private_flag() -> None:
    assert summary(private=True).private is True
    assert summary(private="yes").private is None


@pytest.mark.parametrize(("value", "expected"), [
    ("2026-05-28T20:26:40Z", datetime(2026, 5, 28, 20, 26, 40, tzinfo=UTC)),
    ("2026-05-28T22:26:40+02:00", datetime(2026, 5, 28, 20, 26, 40, tzinfo=UTC)),
    ("2026-05-28T20:26:40", datetime(2026, 5, 28, 20, 26, 40, tzinfo=UTC)),
    (1_780_000_000, datetime(2026, 5, 28, 20, 26, 40, tzinfo=UTC)),
    ("1780000000", datetime(2026, 5, 28, 20, 26, 40, tzinfo=UTC)),
    ("yesterday", None), (10**30, None), (float("nan"), None), (None, None), (True, None),
])
def test_created_at_iso_or_unix_seconds(value: Any, expected: datetime | None) -> None:
    got = summary(created_at=value).created_at
    assert got == expected
    assert got is None or got.tzinfo is not None


@pytest.mark.parametrize("value", [0, -3, 2**63, "12a", 1.5, True, [1], "٣"])
def test_ids_that_are_not_positive_integers_read_as_none(value: Any) -> None:
    assert summary(id=value).message_id is None


def test_digit_string_ids_are_read() -> None:
    assert summary(id="4711").message_id == 4711


def test_other_events_are_kept_as_other_with_no_message_fields() -> None:
    conversation_created = {"event": "conversation_created", "id": 17, "contact_inbox": {"id": 5003}}
    assert summarize(conversation_created) == EventSummary(event="other")
    assert summarize({"event": "something_new"}) == EventSummary(event="other")


@pytest.mark.parametrize("payload", [{}, {"event": 3}, {"event": None}, {"id": 1}])
def test_not_an_event(payload: dict[str, Any]) -> None:
    assert summarize(payload) is None


def test_non_object_payloads_are_not_events() -> None:
    assert summarize([{"event": "message_updated"}]) is None  # type: ignore[arg-type]


def test_no_content_names_phones_or_emails_in_the_summary() -> None:
    payload = message_event(sender={"id": 33, "name": "Ada Patient", "type": "contact", "email": "ada@example.org"},
                            source_id=PHONE.lstrip("+"))
    stored = json.dumps(summarize(payload).model_dump(mode="json"))  # type: ignore[union-attr]
    for private in (CONTENT, "Ada Patient", PHONE, PHONE.lstrip("+"), "ada@example.org", "Demo Clinic", "SMS"):
        assert private not in stored


def test_the_summary_is_frozen() -> None:
    with pytest.raises(ValidationError):
        summary().status = "read"  # type: ignore[misc]


def test_a_stock_incoming_sender_without_type_is_the_contact() -> None:
    # the stock contact shape: account, additional_attributes, avatar, ..., blocked; no "type"
    stock_sender = {"account": {"id": 1, "name": "Demo Clinic"}, "additional_attributes": {}, "avatar": "",
                    "custom_attributes": {}, "email": None, "id": 55, "identifier": None, "name": "Ada",
                    "phone_number": PHONE, "thumbnail": "", "blocked": False}
    payload = message_event(event="message_created", message_type="incoming", sender=stock_sender,
                            created_at="2026-05-28T20:26:39.123Z")
    del payload["status"]
    got = summarize(payload)
    assert got is not None
    assert (got.message_type, got.contact_id, got.status) == ("incoming", 55, None)
    assert got.created_at == datetime(2026, 5, 28, 20, 26, 39, 123000, tzinfo=UTC)


def test_an_outgoing_sender_without_type_is_not_taken_for_the_contact() -> None:
    got = summarize(message_event(sender={"id": 9, "name": "Agent"}))
    assert got is not None and got.contact_id == 33  # the conversation's contact, not the agent


@pytest.mark.parametrize(("text", "kept"), [
    ("21211: The 'To' number +1 555 010 9999 is not a valid phone number",
     "21211: The 'To' number [number] is not a valid phone number"),
    ("(#131026) Message undeliverable to 15550109999", "(#131026) Message undeliverable to [number]"),
    ("131047: Re-engagement message", "131047: Re-engagement message"),
    ("131026 - Message undeliverable", "131026 - Message undeliverable"),
])
def test_a_provider_s_error_keeps_its_code_and_loses_any_number_or_address(text: str, kept: str) -> None:
    got = summary(status="failed", external_error=text).external_error
    assert got == kept
    assert parse_error_code(got) == parse_error_code(text)  # the fallback rules read the same code


@pytest.mark.parametrize(("text", "kept"), [
    ("550 5.1.1 <jane.doe@example.org>: Recipient address rejected", "[number] <[address]>: Recipient address rejected"),
    ("555 010 9999 unreachable", "[number] unreachable"),
    ("555 - 0199 unreachable", "[number] unreachable"),
])
def test_leading_digits_that_do_not_read_as_a_code_are_a_number(text: str, kept: str) -> None:
    assert summary(status="failed", external_error=text).external_error == kept
