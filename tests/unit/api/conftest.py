"""Shared fakes for the API client tests: a recording MockTransport, no servers."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from dispatcher.api import WorkspaceClient
from tests.support.fixtures import EXAMPLES as FIXTURE_EXAMPLES

SECRET_TOKEN = "tok-S3cr3t-9f8e7d6c5b4a"
BASE_URL = "https://workspace.example"
ACCOUNT_ID = 7
PREFIX = f"/api/v1/accounts/{ACCOUNT_ID}"
EXAMPLES = FIXTURE_EXAMPLES  # request bodies from the service's public material

Handler = Callable[[httpx.Request], httpx.Response]


@dataclass
class Recorder:
    """A MockTransport handler that records requests and answers from a queue or a function."""

    answer: Handler
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answer(request)

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def last_json(self) -> Any:
        return json.loads(self.last.content)


def reply(status: int = 200, body: Any = None, **kwargs: Any) -> Handler:
    """A handler that always answers ``status`` with ``body`` as JSON (or raw ``content=``)."""
    def answer(request: httpx.Request) -> httpx.Response:
        if "content" in kwargs or body is None:
            return httpx.Response(status, **kwargs)
        return httpx.Response(status, json=body, **kwargs)
    return answer


def raising(exc_type: type[httpx.TransportError]) -> Handler:
    def answer(request: httpx.Request) -> httpx.Response:
        raise exc_type("boom", request=request)
    return answer


@pytest.fixture
def make_client() -> Callable[..., tuple[WorkspaceClient, Recorder]]:
    clients: list[WorkspaceClient] = []

    def build(answer: Handler, *, token: str = SECRET_TOKEN) -> tuple[WorkspaceClient, Recorder]:
        recorder = Recorder(answer)
        client = WorkspaceClient(base_url=BASE_URL, account_id=ACCOUNT_ID, api_token=token,
                                 transport=httpx.MockTransport(recorder))
        clients.append(client)
        return client, recorder

    yield build
    for client in clients:
        client.close()


# One call per operation with plausible arguments, for tests that walk every operation.
CALLS: dict[str, Callable[[WorkspaceClient], Any]] = {
    "listInboxes": lambda c: c.list_inboxes(),
    "searchContacts": lambda c: c.search_contacts("+15551234567"),
    "createContact": lambda c: c.create_contact(inbox_id=3, name="Ann", phone_number="+15551234567"),
    "listContactableInboxes": lambda c: c.list_contactable_inboxes(11),
    "listConversations": lambda c: c.list_conversations(inbox_id=3),
    "createConversation": lambda c: c.create_conversation(source_id="15551234567", inbox_id=3, contact_id=11),
    "listMessages": lambda c: c.list_messages(42),
    "createMessage": lambda c: c.create_message(42, content="Your appointment is at 9:00"),
    "listWebhooks": lambda c: c.list_webhooks(),
    "createWebhook": lambda c: c.create_webhook(url="https://hooks.example/in", subscriptions=["message_updated"]),
}
WRITES = {"createContact", "createConversation", "createMessage", "createWebhook"}
