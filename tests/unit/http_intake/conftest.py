"""A Dispatcher on a migrated SQLite store in a temporary folder, a list for a broker, and the
HTTP intake around it in Starlette's TestClient: no servers."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake.http import create_intake_app
from dispatcher.service import Dispatcher
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Notification, Payload
from tests.support.dispatcher_setup import example_settings

with warnings.catch_warnings():
    # starlette 0.52's testclient names anyio.abc.BlockingPortal at import time, an alias that
    # anyio 4.16 deprecates; warnings are errors here, so this one import is excused.
    warnings.filterwarnings("ignore", message=r"The anyio\.abc\.\w+ alias is deprecated", category=DeprecationWarning)
    from starlette.testclient import TestClient

TOKEN = "intake-token-3b9e51c07d"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PHONE = "+15550308877"
EMAIL = "ana.patient@example.org"
NAME = "Ana Patient"
CONTENT = "Hello Ana, your oncology follow-up is on Monday at 09:00."
PATH = "/v1/notifications"


def valid_request(event_id: str = "appt-1", /, **changes: Any) -> dict[str, Any]:
    """A valid reminder for the example configuration; ``a__b=value`` sets a nested key and
    ``a__b=...`` removes it."""
    request: dict[str, Any] = {
        "event_id": event_id,
        "route": "reminders",
        "contact": {"identifier": "patient-1001", "phone_number": PHONE, "name": NAME},
        "content": CONTENT,
        "template": {"name": "appointment_reminder", "language": "en", "category": "UTILITY",
                     "params": {"1": NAME, "2": "Monday 09:00"}},
        "metadata": {"appointment": "A-77"},
    }
    request = copy.deepcopy(request)
    for dotted, value in changes.items():
        target = request
        *path, last = dotted.split("__")
        for part in path:
            target = target[part]
        if value is ...:
            target.pop(last, None)
        else:
            target[last] = value
    return request


@dataclass
class Intake:
    client: TestClient
    dispatcher: Dispatcher
    enqueuer: ListEnqueuer

    def post(self, body: Any, *, headers: dict[str, str] | None = None) -> Any:
        return self.client.post(PATH, json=body, headers=AUTH if headers is None else headers)

    def rows(self) -> int:
        with self.dispatcher.sessions() as session:
            return int(session.scalar(select(func.count()).select_from(Notification)) or 0)

    def payloads(self) -> int:
        with self.dispatcher.sessions() as session:
            return int(session.scalar(select(func.count()).select_from(Payload)) or 0)


@pytest.fixture()
def store_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/store.sqlite"
    upgrade_database(url)
    return url


@pytest.fixture()
def intake(store_url: str, clean_environment: pytest.MonkeyPatch) -> Iterator[Intake]:
    enqueuer = ListEnqueuer()
    dispatcher = Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=store_url), enqueuer=enqueuer)
    with TestClient(create_intake_app(dispatcher, token=TOKEN)) as client:
        yield Intake(client, dispatcher, enqueuer)
