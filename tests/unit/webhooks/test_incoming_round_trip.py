"""An incoming customer message of the stock shape, from the receiver through SQLite to the consumer.

The defect the stock sandbox exposed: the receiver stores the event summary as JSON, the consumer
read it back as a dict and handed the ISO ``created_at`` string to a DateTime column, which SQLite
refuses, on every retry, forever; the 24-hour window never opened. Here the body is what a stock
server sends (Rails escapes, ISO-8601 with milliseconds, the stock contact as sender, no status,
``X-Chatwoot-*`` headers), the store is SQLite, and the consumer reads the stored row.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from dispatcher.api import WorkspaceClient
from dispatcher.context import InboxDirectory, SendContext, retry_plan_of
from dispatcher.policy.channels import window_open
from dispatcher.policy.ratelimit import LocalLimiter
from dispatcher.store import queries as store
from dispatcher.store.account import Account
from dispatcher.tracking.reconcile import process_delivery

from .conftest import NOW, PHONE, make_settings, running_receiver, signed_headers

ACCOUNT = Account("default", 1)  # the top-level instance's account 1

CONTACT_ID, INBOX_ID = 55, 1
RECEIVED_AT = datetime.fromtimestamp(NOW, UTC)


def stock_incoming_body() -> bytes:
    """message_created for a customer's reply, written the way the stock server writes it."""
    payload = {
        "event": "message_created",
        "id": 901,
        "content": "Yes <I'll> come & bring the form",
        "content_type": "text",
        "content_attributes": {},
        "additional_attributes": {},
        "message_type": "incoming",
        "private": False,
        "source_id": "wamid.HBgLMTU1NTgwMDEyMzQVAgASGBQzQTAA",
        "created_at": "2026-05-28T20:26:39.123Z",
        "sender": {"account": {"id": 1, "name": "Demo Clinic"}, "additional_attributes": {}, "avatar": "",
                   "custom_attributes": {}, "email": None, "id": CONTACT_ID, "identifier": "patient-55",
                   "name": "Ada Patient", "phone_number": PHONE, "thumbnail": "", "blocked": False},
        "inbox": {"id": INBOX_ID, "name": "WhatsApp Reminders"},
        "account": {"id": 1, "name": "Demo Clinic"},
        "conversation": {"id": 17, "inbox_id": INBOX_ID,
                         "contact_inbox": {"id": 5003, "contact_id": CONTACT_ID, "inbox_id": INBOX_ID,
                                           "source_id": PHONE.lstrip("+")}},
    }
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def refusing_api() -> WorkspaceClient:
    """Opening the window needs no API call: any call fails the test."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"unexpected API call {request.method} {request.url.path}")

    return WorkspaceClient.from_settings(make_settings(), transport=httpx.MockTransport(refuse))


def test_a_stock_incoming_message_opens_the_window_through_the_stored_summary(tmp_path: Path) -> None:
    body = stock_incoming_body()
    assert b"\\u003cI'll\\u003e" in body  # given the stock escapes, signed as sent
    with running_receiver(tmp_path) as receiver:  # the default header dialect: auto
        answer = receiver.post(body, signed_headers(body, prefix="Chatwoot", delivery_id="in-1"))
        assert answer.status_code == 200, answer.text
        [row_id] = receiver.published
        settings = make_settings()
        with refusing_api() as api:
            context = SendContext(
                settings=settings, api=api, sessions=receiver.sessions, limiter=LocalLimiter({}),
                inboxes=InboxDirectory(list), plan=retry_plan_of(settings), clock=lambda: RECEIVED_AT,
            )
            # when the consumer applies the recorded delivery, it opens the window, once
            assert process_delivery(row_id, context, None) == "window_opened"  # type: ignore[arg-type]
            assert process_delivery(row_id, context, None) == "already_processed"  # type: ignore[arg-type]
        with receiver.sessions() as session:
            assert window_open(store.last_incoming_at(session, account=ACCOUNT, contact_id=CONTACT_ID, inbox_id=INBOX_ID),
                               now=RECEIVED_AT)
            later = RECEIVED_AT + timedelta(hours=24)
            assert not window_open(store.last_incoming_at(session, account=ACCOUNT, contact_id=CONTACT_ID, inbox_id=INBOX_ID),
                                   now=later)
        # and nothing of the message (content, phone, name) was stored
        stored = json.dumps([list(row) for row in receiver.rows()], default=str)
        assert "bring the form" not in stored and PHONE not in stored and "Ada" not in stored
