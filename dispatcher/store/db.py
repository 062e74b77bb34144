"""Engines and sessions for the dispatcher's store, SQLite (embedded) or PostgreSQL (production)."""

from __future__ import annotations

import re
import select
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.errors import ConfigurationError
from dispatcher.faults import crash_point

# Text no store of ours can keep: PostgreSQL refuses a NUL, and UTF-8 cannot encode a lone UTF-16
# surrogate. Intake and the webhook receiver refuse it at the edge, so nothing fails later.
UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")
SQLITE_BUSY_TIMEOUT_MS = 30_000  # several worker processes share one file: wait for the lock, don't fail
PG_CONNECT_TIMEOUT_S = 5
PG_STATEMENT_TIMEOUT_MS = 30_000
PG_LOCK_TIMEOUT_MS = 10_000
PG_POOL_TIMEOUT_S = 10  # waiting for a free pooled connection
# In the database URL: a pooler in transaction mode stands in front of PostgreSQL (the
# ``database_pooler`` setting puts it there); make_engine takes it out.
POOLER_PARAMETER = "dispatcher_pooler"
_POOLED = "dispatcher_transaction_pooler"  # the engine's execution option that says so


def make_engine(database_url: str, *, statement_timeout: bool = True, **options: Any) -> Engine:
    """An engine with the settings each backend needs for several processes writing at once.

    ``hide_parameters``: a statement's parameters (contents, contact details) never appear in the
    text of a database error, which may reach a log, a traceback or Flower. ``statement_timeout``
    False: no statement limit (migrations, which may rewrite a large table). A URL with
    ``dispatcher_pooler=transaction`` (``database_pooler``) goes through a pooler in transaction
    mode: see :func:`_through_a_transaction_pooler`."""
    options.setdefault("hide_parameters", True)
    url = make_url(database_url)
    pooler = url.query.get(POOLER_PARAMETER)
    url = url.difference_update_query([POOLER_PARAMETER])
    if url.get_backend_name() == "sqlite":
        if pooler is not None:
            raise ConfigurationError("DISPATCHER_DATABASE_POOLER (database_pooler)", "applies to PostgreSQL only")
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **options)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_immediate)
        return engine
    if pooler not in (None, "transaction"):
        raise ConfigurationError("DISPATCHER_DATABASE_POOLER (database_pooler)", "is none or transaction")
    # Bounded waits: a database that does not answer fails a connect in 5 s, a statement is
    # cancelled after 30 s and a lock wait after 10 s, so no process hangs on a frozen store.
    statement_ms = PG_STATEMENT_TIMEOUT_MS if statement_timeout else 0
    if pooler == "transaction":
        return _through_a_transaction_pooler(url, statement_ms, options)
    connect_args = {"connect_timeout": PG_CONNECT_TIMEOUT_S,
                    "options": f"-c statement_timeout={statement_ms} -c lock_timeout={PG_LOCK_TIMEOUT_MS}"}
    engine = create_engine(url, pool_timeout=PG_POOL_TIMEOUT_S, connect_args=connect_args, **options)
    event.listen(engine, "checkout", _refuse_a_connection_the_server_closed)
    return engine


def _through_a_transaction_pooler(url: URL, statement_ms: int, options: dict[str, Any]) -> Engine:
    """PostgreSQL behind a pooler that lends a server connection for one transaction (PgBouncer's
    ``pool_mode = transaction``): consecutive transactions of one client connection may run on
    different server connections, so nothing may outlive a transaction on the server.

    - No server-side prepared statements (psycopg prepares a statement it ran 5 times on a
      connection; the next transaction may reach a server connection without it):
      ``prepare_threshold=None``. Each statement is then planned every time it runs.
    - No ``options`` startup parameter (PgBouncer 1.18 refuses it; later ones pass on only the
      parameters they track). Where the server's own defaults already are the two timeouts
      (``ALTER ROLE ... SET``, or the pooler's ``connect_query``; read at each new connection),
      nothing more is needed. Elsewhere each transaction sets them, with ``set_config(..., true)``
      (``SET LOCAL``) as its first statement, and the moves that run alone in autocommit on a
      direct connection run in a transaction, which alone carries them: a warm send's 3 round
      trips become 9 (tests/integration/test_statements_built_once.py)."""
    connect_args = {"connect_timeout": PG_CONNECT_TIMEOUT_S, "prepare_threshold": None}
    server = _ServerTimeouts(expected={"statement_timeout": str(statement_ms), "lock_timeout": str(PG_LOCK_TIMEOUT_MS)})
    engine = create_engine(url, pool_timeout=PG_POOL_TIMEOUT_S, connect_args=connect_args,
                           execution_options={_POOLED: server}, **options)
    event.listen(engine, "checkout", _refuse_a_connection_the_server_closed)
    event.listen(engine, "connect", server.read)
    timeouts = text("SELECT set_config('statement_timeout', :statement_timeout, true), "
                    "set_config('lock_timeout', :lock_timeout, true)")

    @event.listens_for(engine, "begin")
    def _timeouts_for_this_transaction(connection: Connection) -> None:
        if not server.hold and connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            connection.execute(timeouts, server.expected)

    return engine


@dataclass
class _ServerTimeouts:
    """Whether the server's own defaults are the timeouts a transaction needs (``expected``, in
    ms), as every new connection through the pooler has read them so far."""

    expected: dict[str, str]
    hold: bool = False
    _read: bool = False

    def read(self, dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT name, setting FROM pg_settings WHERE name IN ('statement_timeout', 'lock_timeout')")
            found = dict(cursor.fetchall())
        dbapi_connection.rollback()  # the read's own transaction: the pool hands the connection out idle
        self.hold = found == self.expected and (self.hold or not self._read)
        self._read = True


def only_a_transaction_carries_the_timeouts(session: Session) -> bool:
    """Whether ``session``'s engine reaches PostgreSQL through a pooler in transaction mode where
    only a transaction carries the timeouts (the server's defaults are not them)."""
    server = session.get_bind().engine.get_execution_options().get(_POOLED)
    return server is not None and not server.hold


def _refuse_a_connection_the_server_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """The pool's check of a connection it hands out, without a round trip (``pool_pre_ping``
    costs one for every transaction: 2 of a warm send's 7). An idle connection has nothing to
    read: the server speaks only when asked. A server that restarted, or ended this backend
    (``pg_terminate_backend``, an idle timeout, a pooler's restart), has written its farewell and
    closed the socket, so the socket reads ready; the pool then throws the connection away and
    opens a new one (:class:`DisconnectionError`). A notice the server volunteers costs one
    reconnection, nothing more. What no check at checkout can see, a connection that dies after
    it, a ping could not see either."""
    if dbapi_connection.closed or dbapi_connection.broken:
        raise DisconnectionError("the pooled connection is closed")
    try:
        ready, _, _ = select.select([dbapi_connection.fileno()], [], [], 0)
    except (OSError, ValueError) as error:
        raise DisconnectionError("the pooled connection's socket is gone") from error
    if ready:
        raise DisconnectionError("the store closed the pooled connection")


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    # WAL lets readers run beside the one writer; foreign keys are off by default in SQLite.
    connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (see _sqlite_begin_immediate)
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin_immediate(connection: Any) -> None:
    # Take the write lock at BEGIN: a read-then-write transaction that upgrades later can fail
    # with "database is locked" without waiting; BEGIN IMMEDIATE waits for busy_timeout instead.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


_engines: dict[str, Engine] = {}


def shared_engine(database_url: str) -> Engine:
    """One engine per URL per process; after a fork, call :func:`dispose_after_fork`."""
    engine = _engines.get(database_url)
    if engine is None:
        engine = _engines[database_url] = make_engine(database_url)
    return engine


ANNOUNCE_KEY = "announce_callbacks"  # in session.info: the moves write outcome callbacks


def session_factory(engine: Engine, *, announce: bool = False) -> sessionmaker[Session]:
    """Sessions on ``engine``. ``announce``: the lifecycle's moves write the host's outcome
    callbacks in their transactions (:mod:`dispatcher.lifecycle.announce`; callbacks are configured)."""
    sessions = sessionmaker(engine, expire_on_commit=False, info={ANNOUNCE_KEY: True} if announce else {})
    # Crash points (dispatcher.faults): a process may die with its transaction open (it is
    # discarded) or right after a commit (the work is kept, the process's memory is not).
    event.listen(sessions, "before_commit", _before_commit)
    event.listen(sessions, "after_commit", _after_commit)
    return sessions


def _before_commit(session: Session) -> None:
    crash_point("before commit", in_transaction=True)


def _after_commit(session: Session) -> None:
    crash_point("after commit")


def dispose_after_fork() -> None:
    """Forget pooled connections inherited from a parent process (Celery prefork children)."""
    for engine in _engines.values():
        engine.dispose(close=False)


@dataclass(frozen=True)
class BoundCondition:
    """A condition for another statement's ``WHERE``, built once with bound parameters, and the
    values of those parameters for this use: the statement that takes it is built once too."""

    clause: Any
    params: Mapping[str, Any] = field(default_factory=dict)


def ping(session: Session) -> None:
    """One round trip to the store; raises SQLAlchemyError when it does not answer."""
    session.execute(text("SELECT 1"))


def takes_writes(session: Session, *, lock_timeout_ms: int) -> bool:
    """Whether the store would take a webhook delivery's write now, asked without writing: the
    lock an insert into ``webhook_deliveries`` takes, within ``lock_timeout_ms`` (a table lock
    someone holds makes it wait), and a transaction that may write (a server in recovery or read
    only says no). On SQLite the session's ``BEGIN IMMEDIATE`` took the write lock already. Run it
    in a transaction the caller rolls back; raises SQLAlchemyError when the store does not answer."""
    if session.get_bind().dialect.name != "postgresql":
        session.execute(text("SELECT 1"))
        return True
    session.execute(text("SELECT set_config('lock_timeout', :timeout, true)"), {"timeout": f"{int(lock_timeout_ms)}ms"})
    session.execute(text("LOCK TABLE webhook_deliveries IN ROW EXCLUSIVE MODE"))
    return bool(session.execute(text("SELECT current_setting('transaction_read_only')")).scalar_one() == "off")


def insert_for(session: Session) -> Any:
    """The dialect's INSERT (PostgreSQL's or SQLite's), the one with ON CONFLICT clauses."""
    return dialect_insert(session.get_bind().dialect.name)


def dialect_insert(dialect: str) -> Any:
    """:func:`insert_for` by the dialect's name (a statement :func:`~dispatcher.store.built_once.built_once` builds)."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def require_existing_store(database_url: str) -> None:
    """ConfigurationError when ``database_url`` names a SQLite file that does not exist: a command
    that reads or changes what is stored would otherwise make an empty store at a wrong path and
    answer as if nothing were there. Any other store is asked when used."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not Path(url.database).exists():
        raise ConfigurationError("DISPATCHER_DATABASE_URL (database_url)", "names a SQLite file that does not exist "
                                 "(nothing was handed over with this configuration yet, or the path is wrong)")


def stored_sessions(database_url: str) -> sessionmaker[Session]:
    """Sessions on a store that exists (see :func:`require_existing_store`): for a command that reads it."""
    require_existing_store(database_url)
    return session_factory(shared_engine(database_url))
