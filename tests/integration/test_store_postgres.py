"""Store operations whose answer depends on the database driver, checked on PostgreSQL itself
(SQLite answers some of them differently: psycopg 3 gives no row count for INSERT ... ON CONFLICT)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from dispatcher.policy.channels import window_open
from dispatcher.store import queries as store
from dispatcher.store.account import Account
from dispatcher.store.db import make_engine, session_factory
from dispatcher.store.migrate import upgrade_database

ACCOUNT = Account("default", 1)  # the top-level instance's account 1

pytestmark = pytest.mark.integration


def test_applied_status_is_new_once_then_known(fresh_postgres_url: str) -> None:
    upgrade_database(fresh_postgres_url)
    engine = make_engine(fresh_postgres_url)
    sessions = session_factory(engine)
    try:
        with sessions.begin() as session:
            assert store.record_applied_status(session, "default", 41, "delivered") is True
            assert store.record_applied_status(session, "default", 41, "delivered") is False
            assert store.record_applied_status(session, "default", 41, "read") is True
        with sessions.begin() as session:
            assert store.record_applied_status(session, "default", 41, "read") is False
    finally:
        engine.dispose()


def test_applied_statuses_of_a_group_are_new_once_in_one_statement(fresh_postgres_url: str) -> None:
    upgrade_database(fresh_postgres_url)
    engine = make_engine(fresh_postgres_url)
    sessions = session_factory(engine)
    many = [(1000 + n, "delivered") for n in range(store.APPLIED_STATUSES_AT_ONCE + 3)]  # more than one INSERT's rows
    try:
        with sessions.begin() as session:
            assert store.record_applied_status(session, "default", 41, "delivered") is True
        with sessions.begin() as session:
            assert store.record_applied_statuses(session, "default", [
                (41, "delivered"), (41, "read"), (42, "delivered"), (42, "delivered")]) == {(41, "read"), (42, "delivered")}
            assert store.record_applied_statuses(session, "other", [(41, "delivered")]) == {(41, "delivered")}
            assert store.record_applied_statuses(session, "default", many) == set(many)
            assert store.record_applied_statuses(session, "default", many[:2] + [(43, "read")]) == {(43, "read")}
            assert store.record_applied_statuses(session, "default", []) == set()
    finally:
        engine.dispose()


def test_the_service_window_only_moves_forward(fresh_postgres_url: str) -> None:
    upgrade_database(fresh_postgres_url)
    engine = make_engine(fresh_postgres_url)
    sessions = session_factory(engine)
    now = datetime.now(UTC)
    try:
        with sessions.begin() as session:
            store.open_service_window(session, account=ACCOUNT, contact_id=2, inbox_id=3, at=now)
            store.open_service_window(session, account=ACCOUNT, contact_id=2, inbox_id=3, at=now - timedelta(hours=30))
        with sessions() as session:
            last = store.last_incoming_at(session, account=ACCOUNT, contact_id=2, inbox_id=3)
            assert window_open(last, now=now + timedelta(hours=23))
            assert not window_open(last, now=now + timedelta(hours=25))
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_database_error_carries_no_statement_parameters(fresh_postgres_url: str, tmp_path: Any, backend: str) -> None:
    import sqlalchemy as sa
    from sqlalchemy.exc import SQLAlchemyError

    url = fresh_postgres_url if backend == "postgresql" else f"sqlite:///{tmp_path}/hidden.sqlite"
    upgrade_database(url)
    engine = make_engine(url)
    secret = "Reminder for +15550199999: your HIV test result is ready"
    try:
        with pytest.raises(SQLAlchemyError) as raised, engine.begin() as connection:
            # a NUL that PostgreSQL refuses, or a NOT NULL column left empty: either fails with the value bound
            connection.execute(sa.text("INSERT INTO notifications (event_id, fingerprint) VALUES (:e, :f)"),
                               {"e": secret + "\x00", "f": secret})
    finally:
        engine.dispose()
    assert "+15550199999" not in str(raised.value) and "HIV" not in str(raised.value)
    assert "hidden" in str(raised.value).lower()  # SQLAlchemy says the parameters were hidden


def test_a_capped_route_takes_exactly_its_cap_from_fifty_concurrent_hosts(
    fresh_postgres_url: str, clean_environment: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from dispatcher.enqueue import ListEnqueuer
    from dispatcher.errors import InvalidEvent
    from dispatcher.service import Dispatcher
    from tests.support.dispatcher_setup import example_settings

    upgrade_database(fresh_postgres_url)
    dispatcher = Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=fresh_postgres_url),
                            enqueuer=ListEnqueuer())
    cap = dispatcher.settings.routes["web_session"].max_per_minute
    assert cap == 10
    start = threading.Barrier(50)

    def hand_over(n: int) -> str:
        start.wait()
        try:
            dispatcher.notify({"event_id": f"cap-{n}", "route": "web_session", "content": "Your visit is confirmed",
                               "contact": {"identifier": f"p{n}", "phone_number": "+15550300099"},
                               "consent_ref": f"form-{n}"})
        except InvalidEvent as refused:
            assert refused.field == "route"
            return "refused"
        return "accepted"

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(hand_over, range(50)))
    assert (results.count("accepted"), results.count("refused")) == (cap, 50 - cap)


def _backend_pid(sessions: Any) -> int:
    with sessions() as session:
        return int(session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


@pytest.mark.parametrize("farewell", ["terminate", "idle timeout"])
def test_a_pooled_connection_the_server_closed_is_replaced_before_use(fresh_postgres_url: str, farewell: str) -> None:
    """Without ``pool_pre_ping``'s round trip: a backend the server ended while it sat in the
    pool (an operator's ``pg_terminate_backend``, the server's own idle timeout; a restart ends
    them all the same way) is thrown away when the pool hands it out, and the transaction runs
    on a new one instead of failing."""
    engine = make_engine(fresh_postgres_url, pool_size=1, max_overflow=0)
    watcher = make_engine(fresh_postgres_url)
    sessions = session_factory(engine)
    try:
        with sessions.begin() as session:
            if farewell == "idle timeout":  # in ms, for this backend only: it ends once idle, back in the pool
                session.execute(sa.text("SET idle_session_timeout = 1"))
            pid = int(session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
        with watcher.connect() as other:
            if farewell == "terminate":
                assert other.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
            gone = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
            for _ in range(500):  # bounded: until the backend has exited
                if other.execute(gone, {"pid": pid}).scalar_one() == 0:
                    break
                other.execute(sa.text("SELECT pg_sleep(0.01)"))
            else:
                pytest.fail("the backend did not exit")
        assert _backend_pid(sessions) != pid  # no OperationalError: a new connection took the old one's place
    finally:
        watcher.dispose()
        engine.dispose()
