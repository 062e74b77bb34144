"""The dashboard's trends read from a store on SQLite and on PostgreSQL: rows put in with chosen
times give exactly the per-minute counts, the backlog and the percentiles worked out by hand
below, and every statement the read runs is served by an index (no table is scanned whole)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.lifecycle import trends
from dispatcher.lifecycle.states import AttemptState as A
from dispatcher.lifecycle.states import NotificationState as N
from dispatcher.store.db import make_engine, session_factory
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import AppliedStatus, Attempt, Notification

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 25, 12, 0, 30, tzinfo=UTC)  # the hour shown: 11:01 to 12:01 (the current minute last)
EVENTS = itertools.count(1)
MESSAGES = itertools.count(900)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'trends.sqlite'}" if request.param == "sqlite" \
        else request.getfixturevalue("fresh_postgres_url")
    upgrade_database(url)
    made = make_engine(url)
    try:
        yield made
    finally:
        made.dispose()


def at(clock: str) -> datetime:
    """A time of NOW's day, "HH:MM" or "HH:MM:SS"."""
    parts = [int(part) for part in clock.split(":")]
    return NOW.replace(hour=parts[0], minute=parts[1], second=parts[2] if len(parts) > 2 else 0)


def put(sessions: sessionmaker[Session], *, route: str, state: str, created: str,
        attempts: tuple[tuple[str, str | None, str | None], ...] = (), delivered: str | None = None) -> None:
    """A notification handed over at ``created``, with attempts (state, accepted, status time), the
    last its current one; ``delivered``: when a delivery was applied to that attempt's message."""
    with sessions.begin() as session:
        notification = Notification(event_id=f"trend-{next(EVENTS)}", fingerprint="f" * 64, route=route, state=state,
                                    created_at=at(created), updated_at=at(created), current_attempt=max(1, len(attempts)))
        session.add(notification)
        session.flush()
        message_id = None
        for number, (attempt_state, accepted, status) in enumerate(attempts, start=1):
            message_id = next(MESSAGES) if accepted else None
            session.add(Attempt(notification_id=notification.id, number=number, route=route, channel="sms",
                                state=attempt_state, message_id=message_id, tries=0,
                                accepted_at=at(accepted) if accepted else None, status_at=at(status) if status else None,
                                created_at=at(created), updated_at=at(created)))
        if delivered is not None:
            assert message_id is not None
            session.add(AppliedStatus(message_id=message_id, status="delivered", applied_at=at(delivered)))


def fill(sessions: sessionmaker[Session]) -> None:
    """Eight notifications around the hour from 11:01 (minute index = minutes past 11:01)."""
    put(sessions, route="reminders", state=N.QUEUED, created="10:00", attempts=((A.QUEUED, None, None),))
    put(sessions, route="reminders", state=N.DELIVERED, created="10:30",  # settles at 11:10:20, minute 9
        attempts=((A.DELIVERED, "10:31", "11:10:20"),))
    put(sessions, route="reminders", state=N.READ, created="09:00",  # delivered 09:05, before the hour; read in it
        attempts=((A.READ, "09:01", "11:20"),), delivered="09:05")
    put(sessions, route="reminders", state=N.READ, created="11:30",  # sent minute 29, settled (delivered) minute 30
        attempts=((A.READ, "11:30:10", "11:45"),), delivered="11:31")
    put(sessions, route="sms", state=N.FAILED, created="11:40", attempts=((A.FAILED, None, "11:40:30"),))
    put(sessions, route="reminders", state=N.SENT, created="11:50",  # the fallback sent in minute 49, not settled
        attempts=((A.FAILED, None, "11:50:05"), (A.SENT, "11:50:20", "11:52")))
    put(sessions, route="reminders", state=N.CANCELLED, created="11:55", attempts=((A.FAILED, None, "11:56"),))
    put(sessions, route="reminders", state=N.SCHEDULED, created="11:58")


def only(indexes: dict[int, int]) -> list[int]:
    return [indexes.get(index, 0) for index in range(trends.MINUTES)]


def test_the_hour_read_from_the_store(engine: Engine) -> None:
    sessions = session_factory(engine)
    fill(sessions)
    with sessions() as session:
        read = trends.trends(session, now=NOW)
    assert (read.since, read.until) == (at("11:01"), at("12:01"))
    assert [minute.start for minute in read.minutes] == [at("11:01") + index * trends.MINUTE for index in range(60)]
    assert [minute.handed_over for minute in read.minutes] == only({29: 1, 39: 1, 49: 1, 54: 1, 57: 1})
    assert [minute.sent for minute in read.minutes] == only({29: 1, 49: 1})
    assert [minute.settled for minute in read.minutes] == only({9: 1, 30: 1, 39: 1})
    # the one queued since 10:00 all hour; the one delivered at 11:10:20 until then; the one read
    # (delivered at 11:31:00) for its minute; the fallback from 11:50; the one cancelled at 11:56
    # for its minute; the scheduled one from 11:58. The one handed over and failed in minute 39 never.
    backlog = [2] * 9 + [1] * 20 + [2] + [1] * 19 + [2] * 5 + [3] + [2] * 2 + [3] * 3
    assert [minute.backlog for minute in read.minutes] == backlog
    # reminders: 40 min 20 s (10:30 to 11:10:20) and 60 s; sms: 30 s. Nearest rank of two: p50 the first.
    assert read.latencies == [trends.RouteLatency("reminders", 2, 60.0, 2420.0), trends.RouteLatency("sms", 1, 30.0, 30.0)]


def test_an_empty_store_has_an_empty_hour(engine: Engine) -> None:
    with session_factory(engine)() as session:
        read = trends.trends(session, now=NOW)
    assert len(read.minutes) == 60 and not any(
        (minute.handed_over, minute.sent, minute.settled, minute.backlog) != (0, 0, 0, 0) for minute in read.minutes)
    assert read.latencies == []


def test_every_statement_is_served_by_an_index(engine: Engine) -> None:
    """Each read finds its rows through an index, never by reading a whole table: asked of SQLite's
    plan, and of PostgreSQL's with sequential scans priced out (it still takes one when no index
    serves, so a missing index shows)."""
    sessions = session_factory(engine)
    fill(sessions)
    ran: list[tuple[str, Any]] = []

    def keep(_connection: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        ran.append((statement, parameters))
    event.listen(engine, "before_cursor_execute", keep)
    try:
        with sessions() as session:
            trends.trends(session, now=NOW)
    finally:
        event.remove(engine, "before_cursor_execute", keep)
    statements = [(statement, parameters) for statement, parameters in ran if statement.lstrip().upper().startswith("SELECT")]
    assert len(statements) == 4
    plans = []
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SET enable_seqscan = off"))
        for statement, parameters in statements:
            explain = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
            plan = "\n".join(str(row[-1]) for row in connection.exec_driver_sql(explain + statement, parameters))
            plans.append(plan)
    whole_table = ("SCAN notifications", "SCAN attempts", "SCAN applied_statuses", "Seq Scan")
    assert [plan for plan in plans if any(scan in plan for scan in whole_table)] == []
    # handed over by its time; ended and sent by the attempts' status time; the open ones counted
    handed_over, ended, sent, _ = plans
    assert "ix_notifications_created_at" in handed_over
    assert "ix_attempts_status_at" in ended and "ix_attempts_status_at" in sent
    if engine.dialect.name == "sqlite":  # the index named leads: the read starts from the hour's rows
        assert [plan.splitlines()[0].split(" USING ")[1].split(" (")[0] for plan in (handed_over, ended, sent)] == [
            "INDEX ix_notifications_created_at", "INDEX ix_attempts_status_at", "INDEX ix_attempts_status_at"]
