"""Records accept the wrapped and bare shapes of the field notes and hide personal data."""

from __future__ import annotations

from datetime import UTC, datetime

import pydantic
import pytest

from dispatcher.api.records import (
    Contact,
    ContactCreated,
    ContactInbox,
    Conversation,
    ConversationPage,
    Inbox,
    Message,
    MessagePage,
    MessageStatus,
    MessageType,
    SearchPage,
    Webhook,
    parse_list,
)

PHONE, EMAIL, CONTENT = "+15551234567", "ann@example.org", "Your appointment: cardiology 9:00"
CONTACT = {"id": 11, "name": "Ann Example", "identifier": "patient-77", "phone_number": PHONE,
           "email": EMAIL, "additional_attributes": {"city": "Springfield"}, "thumbnail": ""}
INBOX = {"id": 3, "name": "WhatsApp", "channel_type": "Channel::Whatsapp", "phone_number": "+1555000"}
CONTACT_INBOX = {"source_id": "15551234567", "inbox": INBOX}


def test_inbox_list_wrapped_and_bare() -> None:
    wrapped = parse_list(Inbox, {"payload": [INBOX]})
    assert wrapped == parse_list(Inbox, [INBOX])
    assert wrapped[0].channel_type == "Channel::Whatsapp" and wrapped[0].id == 3


def test_list_shape_errors_are_validation_errors() -> None:
    with pytest.raises(pydantic.ValidationError):
        parse_list(Inbox, {"payload": {"not": "a list"}})
    with pytest.raises(pydantic.ValidationError):
        parse_list(Inbox, {"data": []})


@pytest.mark.parametrize("body", [
    {"payload": {"contact": CONTACT, "contact_inbox": CONTACT_INBOX}},
    {"contact": CONTACT, "contact_inbox": CONTACT_INBOX},
    {**CONTACT, "contact_inbox": CONTACT_INBOX},
], ids=["wrapped", "bare-pair", "bare-contact"])
def test_contact_created_shapes(body: dict) -> None:
    created = ContactCreated.model_validate(body)
    assert created.contact.id == 11
    assert created.contact.identifier == "patient-77"
    assert created.source_id == "15551234567"
    assert created.contact_inbox is not None
    assert created.contact_inbox.inbox == Inbox(**{k: INBOX[k] for k in ("id", "name", "channel_type")})


def test_contact_created_without_binding() -> None:
    created = ContactCreated.model_validate({"payload": CONTACT})
    assert created.contact.id == 11 and created.source_id is None


def test_contact_optional_fields_and_numeric_source_id() -> None:
    assert Contact.model_validate({"id": 5}).phone_number is None
    assert ContactInbox.model_validate({"source_id": 1555, "inbox": None}).source_id == "1555"


def test_contactable_inboxes_list() -> None:
    entries = parse_list(ContactInbox, {"payload": [CONTACT_INBOX, {"source_id": "abc", "inbox": {"id": 4}}]})
    assert [e.source_id for e in entries] == ["15551234567", "abc"]
    assert entries[1].inbox is not None and entries[1].inbox.name is None


@pytest.mark.parametrize("body", [
    {"id": 42, "account_id": 7, "inbox_id": 3, "status": "open", "meta": {"sender": CONTACT}},
    {"payload": {"id": 42, "account_id": 7, "inbox_id": 3, "status": "open"}},
])
def test_conversation_shapes(body: dict) -> None:
    conversation = Conversation.model_validate(body)
    assert (conversation.id, conversation.account_id, conversation.inbox_id) == (42, 7, 3)
    assert PHONE not in repr(conversation)


@pytest.mark.parametrize("body", [
    {"data": {"meta": {"mine_count": 1, "all_count": 2}, "payload": [{"id": 1}, {"id": 2}]}},
    {"meta": {"mine_count": 1, "all_count": 2}, "payload": [{"id": 1}, {"id": 2}]},
    {"payload": [{"id": 1}, {"id": 2}]},
    [{"id": 1}, {"id": 2}],
])
def test_conversation_page_shapes(body: object) -> None:
    page = ConversationPage.model_validate(body)
    assert [c.id for c in page.conversations] == [1, 2]
    assert page.counts in ({}, {"mine_count": 1, "all_count": 2})


@pytest.mark.parametrize("body", [
    {"meta": {"count": 2, "current_page": "2", "has_more": True}, "payload": [CONTACT, {"id": 12}]},
    {"data": {"meta": {"count": 2, "current_page": 2, "has_more": True}, "payload": [CONTACT, {"id": 12}]}},
])
def test_search_page_current_page_as_string_or_int(body: dict) -> None:
    page = SearchPage.model_validate(body)
    assert page.current_page == 2 and page.count == 2 and page.has_more is True
    assert [c.id for c in page.contacts] == [11, 12]


def test_search_page_without_meta() -> None:
    page = SearchPage.model_validate({"payload": []})
    assert page.contacts == [] and page.has_more is None and page.current_page is None


@pytest.mark.parametrize("model", [SearchPage, ConversationPage, MessagePage])
def test_a_page_without_its_list_is_an_error_not_an_empty_page(model: type) -> None:
    with pytest.raises(pydantic.ValidationError):
        model.model_validate({"meta": {"count": 0}})


MESSAGE = {"id": 900, "content": CONTENT, "message_type": 1, "status": "sent",
           "created_at": 1_700_000_000, "source_id": "wamid.HBgL", "conversation_id": 42,
           "content_attributes": {}, "sender": CONTACT}


@pytest.mark.parametrize(("raw", "expected"), [
    (0, MessageType.INCOMING), (1, MessageType.OUTGOING), (2, MessageType.ACTIVITY),
    (3, MessageType.TEMPLATE), ("incoming", MessageType.INCOMING), ("outgoing", MessageType.OUTGOING),
    ("activity", MessageType.ACTIVITY), ("template", MessageType.TEMPLATE), ("1", MessageType.OUTGOING),
    ("Outgoing", MessageType.OUTGOING), (None, None), (9, None), ("carrier-pigeon", None),
])
def test_message_type_int_or_string(raw: object, expected: MessageType | None) -> None:
    assert Message.model_validate({**MESSAGE, "message_type": raw}).message_type is expected


@pytest.mark.parametrize(("raw", "expected"), [
    ("sent", MessageStatus.SENT), ("delivered", MessageStatus.DELIVERED), ("read", MessageStatus.READ),
    ("failed", MessageStatus.FAILED), ("FAILED", MessageStatus.FAILED), (3, MessageStatus.FAILED),
    (None, None), ("progress", None),
])
def test_message_status(raw: object, expected: MessageStatus | None) -> None:
    assert Message.model_validate({**MESSAGE, "status": raw}).status is expected


def test_created_at_unix_seconds_or_iso_string() -> None:
    expected = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert Message.model_validate(MESSAGE).created_at == expected
    iso = Message.model_validate({**MESSAGE, "created_at": "2023-11-14T22:13:20.000Z"})
    assert iso.created_at == expected and iso.created_at.tzinfo is UTC
    naive = Message.model_validate({**MESSAGE, "created_at": "2023-11-14T22:13:20"})
    assert naive.created_at == expected


def test_external_error_top_level_or_in_content_attributes() -> None:
    nested = {**MESSAGE, "status": "failed",
              "content_attributes": {"external_error": "131047: Re-engagement message"}}
    top = {**MESSAGE, "status": "failed", "external_error": "131026: Message undeliverable"}
    assert Message.model_validate(nested).external_error == "131047: Re-engagement message"
    assert Message.model_validate(top).external_error == "131026: Message undeliverable"
    assert Message.model_validate(MESSAGE).external_error is None


def test_message_bare_wrapped_and_webhook_shapes() -> None:
    assert Message.model_validate({"payload": MESSAGE}) == Message.model_validate(MESSAGE)
    event = {"event": "message_updated", "id": 900, "message_type": "outgoing",
             "created_at": "2023-11-14T22:13:20Z", "conversation": {"id": 42, "contact_inbox": {"id": 5}}}
    parsed = Message.model_validate(event)
    assert parsed.conversation_id == 42 and parsed.message_type is MessageType.OUTGOING


def test_message_page_shapes() -> None:
    body = {"meta": {"contact": CONTACT, "labels": []}, "payload": [MESSAGE, {**MESSAGE, "id": 901}]}
    assert [m.id for m in MessagePage.model_validate(body).messages] == [900, 901]
    assert [m.id for m in MessagePage.model_validate([MESSAGE]).messages] == [900]


WEBHOOK = {"id": 5, "name": "dispatcher", "url": "https://hooks.example/in?key=abc",
           "account_id": 7, "subscriptions": ["message_created", "message_updated"],
           "secret": "whsec-very-secret"}


@pytest.mark.parametrize("body", [{"payload": {"webhook": WEBHOOK}}, {"webhook": WEBHOOK}, WEBHOOK,
                                  {"payload": WEBHOOK}])
def test_webhook_shapes(body: dict) -> None:
    webhook = Webhook.model_validate(body)
    assert webhook.id == 5 and webhook.subscriptions == ["message_created", "message_updated"]
    assert webhook.secret is not None and webhook.secret.get_secret_value() == "whsec-very-secret"
    assert "whsec" not in repr(webhook) and "key=abc" not in repr(webhook)


@pytest.mark.parametrize("body", [{"payload": {"webhooks": [WEBHOOK]}}, {"payload": [WEBHOOK]},
                                  {"webhooks": [WEBHOOK]}, [WEBHOOK]])
def test_webhook_list_shapes(body: object) -> None:
    assert [w.id for w in parse_list(Webhook, body, "payload", "webhooks")] == [5]


def test_reprs_hide_personal_data() -> None:
    records = [Contact.model_validate(CONTACT), Message.model_validate(MESSAGE),
               ContactCreated.model_validate({"contact": CONTACT, "contact_inbox": CONTACT_INBOX}),
               SearchPage.model_validate({"payload": [CONTACT]})]
    text = " ".join(repr(r) + str(r) for r in records)
    for value in (PHONE, "15551234567", EMAIL, CONTENT, "Ann Example", "patient-77", "wamid"):
        assert value not in text
    assert "id=11" in text and "id=900" in text


def test_unknown_fields_are_dropped() -> None:
    contact = Contact.model_validate(CONTACT)
    assert "additional_attributes" not in contact.model_dump()
    assert not hasattr(contact, "thumbnail")
