"""Past a configured backlog, HTTP intake pushes back with 429 and Retry-After, and stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake.backlog import RECOUNT_AFTER_S, BacklogGate
from dispatcher.intake.http import create_intake_app
from dispatcher.service import Dispatcher
from tests.support.dispatcher_setup import example_settings
from tests.unit.http_intake.conftest import AUTH, PATH, PHONE, TestClient, valid_request

MAX_BACKLOG = 3


@pytest.fixture()
def dispatcher(store_url: str, clean_environment: pytest.MonkeyPatch) -> Dispatcher:
    return Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=store_url), enqueuer=ListEnqueuer())


@pytest.fixture()
def client(dispatcher: Dispatcher) -> Iterator[TestClient]:
    with TestClient(create_intake_app(dispatcher, token=AUTH["Authorization"].removeprefix("Bearer "),
                                      max_backlog=MAX_BACKLOG, retry_after_s=7)) as client:
        yield client


def test_a_full_backlog_is_answered_429_with_retry_after_and_nothing_is_stored(dispatcher: Dispatcher,
                                                                              client: TestClient) -> None:
    for number in range(MAX_BACKLOG):  # queued: the list enqueuer has no worker behind it
        assert dispatcher.notify(valid_request(f"waiting-{number}")).state == "queued"

    answer = client.post(PATH, json=valid_request("one-too-many"), headers=AUTH)

    assert answer.status_code == 429
    assert answer.headers["Retry-After"] == "7"
    assert answer.json()["error"] == "backlogged"
    assert PHONE not in answer.text
    assert client.get(f"{PATH}/one-too-many", headers=AUTH).status_code == 404  # nothing stored
    assert client.get(f"{PATH}/waiting-0", headers=AUTH).status_code == 200  # status reads go on


def test_a_caller_without_the_token_learns_nothing_of_the_backlog(dispatcher: Dispatcher, client: TestClient) -> None:
    for number in range(MAX_BACKLOG):
        dispatcher.notify(valid_request(f"waiting-{number}"))
    assert client.post(PATH, json=valid_request("x"), headers={"Authorization": "Bearer wrong-token-000000"}).status_code == 401


def test_scheduled_notifications_are_not_backlog(dispatcher: Dispatcher, client: TestClient) -> None:
    later = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    for number in range(MAX_BACKLOG):
        assert dispatcher.notify(valid_request(f"later-{number}", send_at=later)).state == "scheduled"
    assert client.post(PATH, json=valid_request("now"), headers=AUTH).status_code == 202


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_gate_counts_at_most_once_a_second(dispatcher: Dispatcher) -> None:
    counts: list[int] = []
    real_sessions = dispatcher.sessions

    def counting_sessions() -> Session:
        counts.append(1)
        return real_sessions()

    clock = _Clock()
    gate = BacklogGate(counting_sessions, max_backlog=2, clock=clock)  # type: ignore[arg-type]
    dispatcher.notify(valid_request("waiting-0"))
    assert not gate.is_full() and len(counts) == 1

    dispatcher.notify(valid_request("waiting-1"))  # the backlog is full now, but the count is fresh
    clock.now += RECOUNT_AFTER_S / 2
    assert not gate.is_full() and len(counts) == 1

    clock.now += RECOUNT_AFTER_S / 2
    assert gate.is_full() and len(counts) == 2


def test_a_gate_of_zero_never_counts() -> None:
    def no_sessions() -> Session:
        raise AssertionError("a gate that is off must not read the store")

    assert BacklogGate(sessionmaker(), max_backlog=0).is_full() is False
    assert BacklogGate(no_sessions, max_backlog=0).is_full() is False  # type: ignore[arg-type]


def test_a_count_that_fails_is_not_tried_again_within_the_second() -> None:
    calls: list[int] = []

    def failing_sessions() -> Session:
        calls.append(1)
        raise OSError("the store does not answer")

    clock = _Clock()
    gate = BacklogGate(failing_sessions, max_backlog=5, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(OSError):
        gate.is_full()
    assert gate.is_full() is False and len(calls) == 1  # the others go on (and meet the store themselves)
    clock.now += RECOUNT_AFTER_S
    with pytest.raises(OSError):
        gate.is_full()
    assert len(calls) == 2
