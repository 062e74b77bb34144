"""Fakes for the receiver tests: signing, a settings object, a migrated SQLite store, an app.

No servers: the app runs in Starlette's TestClient, the store is a SQLite file in a temporary
folder, the publisher is a list, and "now" is a fixed clock.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.settings import Settings
from dispatcher.store.db import make_engine, session_factory
from dispatcher.store.migrate import upgrade_database
from dispatcher.tracking.webhooks.receiver import create_receiver_app

with warnings.catch_warnings():
    # starlette 0.52's testclient names anyio.abc.BlockingPortal at import time, an alias that
    # anyio 4.16 deprecates; warnings are errors here, so this one import is excused.
    warnings.filterwarnings("ignore", message=r"The anyio\.abc\.\w+ alias is deprecated", category=DeprecationWarning)
    from starlette.testclient import TestClient

NOW = 1_780_000_000  # a fixed "now" for every clock in these tests (unix seconds)
SECRET = "whsec-current-5f1c2e"
OLD_SECRET = "whsec-previous-9a8b7c"
PATH = "/webhooks/messaging"
PHONE = "+15558001234"
CONTENT = "Your appointment at the cardiology clinic is tomorrow"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The contract's rule, written out independently of the code under test."""
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def signed_headers(body: bytes, *, secret: str = SECRET, timestamp: str | None = None, delivery_id: str = "d-1",
                   prefix: str = "Service") -> dict[str, str]:
    ts = str(NOW) if timestamp is None else timestamp
    return {f"X-{prefix}-Delivery": delivery_id, f"X-{prefix}-Timestamp": ts,
            f"X-{prefix}-Signature": sign(secret, ts, body)}


def message_event(**overrides: Any) -> dict[str, Any]:
    """A message_updated payload in the field notes' shape, with personal data in it."""
    payload: dict[str, Any] = {
        "event": "message_updated",
        "id": 4711,
        "content": CONTENT,
        "content_type": "text",
        "content_attributes": {},
        "additional_attributes": {},
        "message_type": "outgoing",
        "private": False,
        "source_id": None,
        "status": "delivered",
        "created_at": "2026-05-28T20:26:40.000Z",
        "sender": {"id": 1, "name": "Clinic Integration", "type": "user"},
        "inbox": {"id": 2, "name": "SMS"},
        "account": {"id": 1, "name": "Demo Clinic"},
        "conversation": {
            "id": 17,
            "inbox_id": 2,
            "contact_inbox": {"id": 5003, "contact_id": 33, "inbox_id": 2, "source_id": PHONE},
            "meta": {"sender": {"id": 33, "name": "Ada Patient", "phone_number": PHONE,
                                "email": "ada@example.org", "type": "contact"}},
            "messages": [{"id": 4712, "content": "a later message", "message_type": 1}],
        },
    }
    payload.update(overrides)
    return payload


def encode(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def make_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"api_url": "http://127.0.0.1:9", "account_id": 1, "api_token": "unit-token",
                              "webhook_secrets": [SECRET], "broker_url": "memory://"}
    values.update(overrides)
    return Settings(**values)


@dataclass
class Clock:
    now: float = float(NOW)

    def __call__(self) -> float:
        return self.now


@dataclass
class Receiver:
    """An app under test with its store, the published row IDs and its clock."""

    client: TestClient
    sessions: sessionmaker[Session]
    published: list[int] = field(default_factory=list)
    clock: Clock = field(default_factory=Clock)

    def post(self, body: bytes, headers: dict[str, str]) -> Any:
        return self.client.post(PATH, content=body, headers=headers)

    def count(self) -> int:
        with self.sessions() as session:
            return int(session.execute(sa.text("SELECT count(*) FROM webhook_deliveries")).scalar_one())

    def rows(self, delivery_id: str | None = None) -> list[Any]:
        query = "SELECT id, delivery_id, event, summary FROM webhook_deliveries"
        with self.sessions() as session:
            if delivery_id is None:
                return list(session.execute(sa.text(query)).all())
            return list(session.execute(sa.text(query + " WHERE delivery_id = :d"), {"d": delivery_id}).all())


def migrated_store(directory: Path) -> sessionmaker[Session]:
    url = f"sqlite:///{directory / 'dispatcher.sqlite'}"
    upgrade_database(url)
    return session_factory(make_engine(url))


@contextlib.contextmanager
def running_receiver(directory: Path, *, publish: Callable[[int], None] | None = None,
                     **settings: Any) -> Iterator[Receiver]:
    """A receiver app over a fresh store in ``directory``; ``publish`` defaults to a list."""
    clock = Clock()
    published: list[int] = []
    sessions = migrated_store(directory)
    app = create_receiver_app(make_settings(**settings), sessions=sessions,
                              publish=publish or published.append, clock=clock)
    with TestClient(app, raise_server_exceptions=True) as client:
        yield Receiver(client=client, sessions=sessions, published=published, clock=clock)


@pytest.fixture()
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    with running_receiver(tmp_path) as running:
        yield running
