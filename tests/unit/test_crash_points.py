"""Crash points: the store and the API client name the places a process may die (dispatcher/faults.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import text

from dispatcher import faults
from dispatcher.api import WorkspaceClient
from dispatcher.store.db import make_engine, session_factory


@pytest.fixture
def recorded() -> Iterator[list[tuple[str, bool]]]:
    sites: list[tuple[str, bool]] = []
    previous = faults.install(lambda site, in_transaction: sites.append((site, in_transaction)))
    yield sites
    faults.install(previous)


def test_without_a_hook_a_point_does_nothing() -> None:
    assert faults.install(None) is None  # production: nothing installed
    faults.crash_point("before commit", in_transaction=True)


def test_every_commit_passes_two_points(recorded: list[tuple[str, bool]]) -> None:
    sessions = session_factory(make_engine("sqlite://"))
    with sessions.begin() as session:
        session.execute(text("SELECT 1"))
    assert recorded == [("before commit", True), ("after commit", False)]


def test_every_request_passes_a_point_before_and_after(recorded: list[tuple[str, bool]]) -> None:
    answer = httpx.MockTransport(lambda request: httpx.Response(200, json={"payload": []}))
    with WorkspaceClient(base_url="http://workspace.test", account_id=1, api_token="t", transport=answer) as client:
        client.list_inboxes()
    assert recorded == [("before listInboxes", False), ("after listInboxes", False)]


def test_a_crash_before_the_commit_discards_the_transaction(recorded: list[tuple[str, bool]]) -> None:
    class Crash(BaseException):
        pass

    def crash_before_commit(site: str, in_transaction: bool) -> None:
        if site == "before commit":
            raise Crash

    sessions = session_factory(make_engine("sqlite://"))
    with sessions.begin() as session:
        session.execute(text("CREATE TABLE kept (x INTEGER)"))
    faults.install(crash_before_commit)
    with pytest.raises(Crash), sessions.begin() as session:
        session.execute(text("INSERT INTO kept VALUES (1)"))
    faults.install(None)
    with sessions() as session:
        assert session.execute(text("SELECT count(*) FROM kept")).scalar_one() == 0
