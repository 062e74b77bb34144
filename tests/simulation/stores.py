"""The store each simulated run starts from: SQLite in memory (the embedded default, and fast), or
PostgreSQL (the production store, WorldSpec.store = "postgresql").

A run's store is one database connection shared by every simulated node: the scheduler never
switches nodes while a transaction is open (World.crash_point), so one connection behaves as the
nodes' own connections would, one transaction after another. The invariants read the same
connection with plain SQL (``World.raw``), so a read inside a node's transaction sees what that
transaction wrote, as the real node would.

SQLAlchemy caches compiled statements per engine: an engine per run would compile every statement
of the real code again in every run (most of a run's time), so each process keeps one engine per
backend and points it at the run's connection.
"""

from __future__ import annotations

import multiprocessing.util
import os
import sqlite3
import tempfile
import uuid
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

from dispatcher.store import db as store_db
from dispatcher.store.migrate import upgrade_database

# The PostgreSQL server the tests use (tests/conftest.py reads the same variable); the simulation
# makes its own database there, one per process, and drops it when the process ends.
SIM_DATABASE_PREFIX = "dispatcher_test_sim_"  # the tests' prefix (dispatcher_test_), and the simulation's
ADMIN_URL = os.environ.get("DISPATCHER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


class Reads(Protocol):
    """Plain SQL on a run's connection, with ``?`` placeholders on either backend."""

    def execute(self, sql: str, parameters: Sequence[object] = ..., /) -> Any: ...

    def close(self) -> None: ...


class Hooks(Protocol):
    """What a run wants told of the real code's transactions."""

    def _began(self) -> None: ...

    def _ended(self) -> None: ...


class SharedEngine:
    """One SQLAlchemy engine of a process, on each run's own connection."""

    def __init__(self, url: str, connect_hooks: Callable[[Engine], None] | None = None) -> None:
        self.url = url
        self.connect_hooks = connect_hooks
        self.run: Hooks | None = None
        self.connection: Any = None
        self.engine: Engine | None = None

    def open(self, run: Hooks, connection: Any) -> Engine:
        self.run, self.connection = run, connection
        if self.engine is None:
            self.engine = create_engine(self.url, creator=lambda: self.connection, poolclass=StaticPool,
                                        hide_parameters=True)
            if self.connect_hooks is not None:
                self.connect_hooks(self.engine)
            event.listen(self.engine, "begin", lambda _c: self.run and self.run._began())
            event.listen(self.engine, "commit", lambda _c: self.run and self.run._ended())
            event.listen(self.engine, "rollback", lambda _c: self.run and self.run._ended())
        self.engine.dispose()  # the pool lets go of the last run's connection and takes this one
        return self.engine


# -- SQLite ---------------------------------------------------------------------------------


@cache
def _sqlite_template() -> sqlite3.Connection:
    """The migrated schema, made once per process; each run starts from an in-memory copy."""
    folder = Path(tempfile.mkdtemp(prefix="dispatcher-sim-"))
    path = folder / "template.sqlite"
    upgrade_database(f"sqlite:///{path}")
    return sqlite3.connect(path, check_same_thread=False)


_SQLITE = SharedEngine("sqlite://", lambda engine: event.listen(engine, "begin", store_db._sqlite_begin_immediate))


def open_sqlite(run: Hooks) -> tuple[Engine, Reads]:
    memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    _sqlite_template().backup(memory)
    return _SQLITE.open(run, memory), memory


# -- PostgreSQL -----------------------------------------------------------------------------


class PostgresReads:
    """``?`` placeholders, as the checks write them for SQLite, on a psycopg connection.

    A read between the nodes' transactions opens one (psycopg begins implicitly), which the next
    node's transaction continues and commits: harmless at READ COMMITTED on one connection, and
    our code reads no server time (``now()``) that the earlier start would move."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def execute(self, sql: str, parameters: Sequence[object] = (), /) -> Any:
        return self.connection.execute(sql.replace("%", "%%").replace("?", "%s"), tuple(parameters))

    def close(self) -> None:
        self.connection.close()


class PostgresDatabase:
    """The process's own database, migrated once; every run empties its tables first."""

    def __init__(self, admin_url: str) -> None:
        import psycopg

        self.name = f"{SIM_DATABASE_PREFIX}{uuid.uuid4().hex[:10]}"
        # The process holds a lock named after its database for as long as it lives: a process
        # killed outright (SIGKILL, a mutmut timeout, a cancelled CI job) runs no finalizer, but
        # its lock goes with its connection, and the next process to start drops what it left.
        # Autocommit: CREATE and DROP DATABASE run outside any transaction.
        owner = psycopg.connect(_conninfo(admin_url), autocommit=True)
        owner.execute("SELECT pg_advisory_lock(hashtext(%s))", (self.name,))
        _drop_orphans(owner)
        owner.execute(f'CREATE DATABASE "{self.name}"')
        # Dropped when the process ends, a pool's worker process too (multiprocessing runs these
        # finalizers before its children exit, where atexit would not run).
        self.drop = multiprocessing.util.Finalize(self, _drop_and_let_go, exitpriority=10,  # callable once
                                                  args=(self.name, owner))
        self.url = make_url(admin_url).set(database=self.name)
        upgrade_database(self.url.render_as_string(hide_password=False))
        self.conninfo = _conninfo(self.url.render_as_string(hide_password=False))
        self.engine = SharedEngine("postgresql+psycopg://")
        with self._connect() as connection:
            tables = [name for (name,) in connection.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version' "
                "ORDER BY tablename")]
        self.empty_tables = f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"

    def _connect(self) -> Any:
        import psycopg

        # No wait for the disk at each commit: the simulation's crashes are its nodes', never the
        # server's, so what a commit makes durable is never read back after a server restart.
        # The production engine's bounds (dispatcher.store.db.make_engine): a run left holding a lock
        # fails the next one's statements instead of hanging it.
        return psycopg.connect(self.conninfo, options="-c synchronous_commit=off -c lock_timeout=10000 "
                                                      "-c statement_timeout=30000")

    def open(self, run: Hooks) -> tuple[Engine, Reads]:
        connection = self._connect()
        connection.execute(self.empty_tables)
        connection.commit()
        return self.engine.open(run, connection), PostgresReads(connection)


def _conninfo(url: str) -> str:
    """A SQLAlchemy URL as psycopg takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _drop_orphans(owner: Any) -> None:
    """Drop the simulation databases whose process is gone: nobody holds their lock."""
    names = [name for (name,) in owner.execute(
        "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (SIM_DATABASE_PREFIX,))]
    for name in names:
        if owner.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (name,)).fetchone()[0]:
            try:
                owner.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                owner.execute("SELECT pg_advisory_unlock(hashtext(%s))", (name,))


def _drop_and_let_go(name: str, owner: Any) -> None:
    try:
        owner.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        owner.close()  # the lock goes with it


def postgres_answers() -> str | None:
    """None when the tests' PostgreSQL server answers; else what went wrong, in one line (no URL:
    it may hold a password)."""
    import psycopg

    try:
        psycopg.connect(_conninfo(ADMIN_URL), connect_timeout=5).close()
    except psycopg.Error as error:
        return f"PostgreSQL does not answer at DISPATCHER_TEST_POSTGRES_URL ({type(error).__name__})"
    return None


@cache
def _postgres() -> PostgresDatabase:
    return PostgresDatabase(ADMIN_URL)


def open_postgres(run: Hooks) -> tuple[Engine, Reads]:
    return _postgres().open(run)


def drop_postgres() -> None:
    """Drop the process's database now, if it made one (the tests do, rather than wait for the exit)."""
    if _postgres.cache_info().currsize:
        database = _postgres()
        _postgres.cache_clear()
        database.drop()


OPENERS: dict[str, Callable[[Hooks], tuple[Engine, Reads]]] = {"sqlite": open_sqlite, "postgresql": open_postgres}
