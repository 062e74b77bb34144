"""The hot paths compile no statement once they are warm (issue 46: statements built once).

SQLAlchemy compiles a statement without a cache key (every ``INSERT ... ON CONFLICT``) on every
execution; :mod:`dispatcher.store.built_once` writes those once. Given a store and a sandbox on
SQLite and on PostgreSQL, one round of the send, the receiver and the consumer warms the process;
a second round, with new events and a new patient, must compile nothing: a new contact, warm
sends, deliveries recorded as a burst, delivered, read, a failure that falls back and the
fallback's send.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.lifecycle import moves
from dispatcher.sending.send import Outcome
from dispatcher.store import queries as store
from dispatcher.store.built_once import count_compilations
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import utcnow
from dispatcher.tracking.reconcile import process_deliveries, process_delivery
from dispatcher.tracking.webhooks.deliveries import NewDelivery, record_deliveries
from tests.support.dispatcher_setup import drive, example_settings, reminder, send_context
from tests.support.pgbouncer import private_pgbouncer
from tests.support.sandbox_process import SandboxProcess, running_sandbox
from tests.support.tcp_proxy import tcp_proxy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with running_sandbox() as process:
        yield process


@pytest.fixture(params=["sqlite", "postgresql"])
def context(request: pytest.FixtureRequest, sandbox: SandboxProcess, tmp_path: Path,
            clean_environment: pytest.MonkeyPatch) -> Iterator[SendContext]:
    sandbox.reset()
    if request.param == "sqlite":
        database_url = f"sqlite:///{tmp_path}/dispatcher.sqlite"
    else:
        database_url = request.getfixturevalue("fresh_postgres_url")
    with send_context(example_settings(api_url=sandbox.base_url, database_url=database_url)) as ctx:
        ctx.enqueuer = ListEnqueuer()
        yield ctx


def _handed_over_and_sent(ctx: SendContext, event_id: str, patient: str) -> tuple[int, int]:
    request = reminder(event_id, identifier=patient, phone=f"+1555041{abs(hash(patient)) % 10000:04d}")
    intake.accept(parse_request(request), sessions=ctx.sessions, settings=ctx.settings, enqueuer=ListEnqueuer())
    with ctx.sessions() as session:
        notification = store.find_notification_by_event(session, event_id)
        assert notification is not None
        notification_id = notification.id
    assert drive(ctx, notification_id)[-1].outcome is Outcome.ACCEPTED
    message_id = intake.status(ctx.sessions, event_id).message_id
    assert message_id is not None
    return notification_id, message_id


def _updated(delivery_id: str, message_id: int, status: str, external_error: str | None = None) -> NewDelivery:
    summary: dict[str, Any] = {"event": "message_updated", "message_id": message_id, "status": status}
    if external_error is not None:
        summary["external_error"] = external_error
    return NewDelivery(delivery_id, "message_updated", summary, utcnow())


def _a_round(ctx: SendContext, name: str) -> None:
    """A new patient's three reminders (the first resolves the contact; two warm sends), their
    outcomes recorded as one burst and applied as one group, and the fallback of the one that failed."""
    patient = f"patient-{name}"
    sent = [_handed_over_and_sent(ctx, f"{name}-{n}", patient) for n in range(3)]
    (_, delivered), (_, read), (falls_back, failed) = sent
    rows = record_deliveries(ctx.sessions, [
        _updated(f"{name}-d", delivered, "delivered"),
        _updated(f"{name}-r1", read, "delivered"),
        _updated(f"{name}-r2", read, "read"),
        _updated(f"{name}-f", failed, "failed", "131026 (#131026) Message undeliverable"),
    ])
    assert None not in rows
    result = process_deliveries([row for row in rows if row is not None], ctx, ctx.enqueuer)
    assert result.words == {"applied_delivered": 2, "applied_read": 1, "fallback": 1}, result.words
    assert drive(ctx, falls_back)[-1].outcome is Outcome.ACCEPTED  # the SMS fallback
    assert intake.status(ctx.sessions, f"{name}-2").fallback_decision == "fallback"


def test_a_warm_process_compiles_no_statement_to_send_record_or_apply_outcomes(context: SendContext) -> None:
    _a_round(context, "warm-up")
    with count_compilations(context.sessions.kw["bind"]) as compiled:
        _a_round(context, "measured")
    assert dict(compiled) == {}


def test_the_count_sees_a_statement_compiled_on_every_execution(context: SendContext) -> None:
    """The count is not blind: an ``INSERT ... ON CONFLICT`` built as Core each time is counted each time."""
    from dispatcher.store.db import insert_for
    from dispatcher.store.models import SpentEvent, table_of

    table = table_of(SpentEvent)
    with context.sessions.begin() as session, count_compilations(context.sessions.kw["bind"]) as compiled:
        for n in range(2):
            session.execute(insert_for(session)(table).values(event_key=f"k{n}", spent_until=utcnow())
                            .on_conflict_do_nothing())
    assert sum(compiled.values()) == 2


def test_a_warm_send_is_three_statements_each_alone_and_its_acceptance_commits_without_waiting(
        context: SendContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim (the load with the run's count and the known target, the compare-and-set) and the
    acceptance: on PostgreSQL three statements, each outside a transaction block (psycopg sends no
    BEGIN and no COMMIT in autocommit), the acceptance's turning ``synchronous_commit`` off for its
    own implicit transaction (no ``SET LOCAL`` of its own). On SQLite two transactions, as before.
    The round trips on the wire: the next test."""
    _handed_over_and_sent(context, "rt-0", "patient-rt")  # the contact, its source_id and conversation are known now
    request = reminder("rt-1", identifier="patient-rt", phone="+15550419999")
    intake.accept(parse_request(request), sessions=context.sessions, settings=context.settings, enqueuer=ListEnqueuer())
    with context.sessions() as session:
        notification = store.find_notification_by_event(session, "rt-1")
        assert notification is not None
    engine = context.sessions.kw["bind"]
    statements: list[str] = []
    commits: list[int] = []
    autocommit_at_accept: list[bool] = []
    accepted_with: list[str] = []
    accept, claim = moves.accept, moves.claim
    autocommit_at_claim: list[bool] = []

    def autocommit(session: Any) -> bool:
        return bool(getattr(session.connection().connection.dbapi_connection, "autocommit", False))

    def accept_and_look(session: Any, **kwargs: Any) -> Any:
        accepted = accept(session, **kwargs)
        autocommit_at_accept.append(autocommit(session))
        return accepted

    def claim_and_look(session: Any, **kwargs: Any) -> Any:
        claimed = claim(session, **kwargs)
        autocommit_at_claim.append(autocommit(session))
        return claimed

    def keep(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(" ".join(statement.split())[:40])
        accepted_with.append(statement)  # the last one is the acceptance

    def commit(*_: object) -> None:
        commits.append(1)

    monkeypatch.setattr(moves, "accept", accept_and_look)
    monkeypatch.setattr(moves, "claim", claim_and_look)
    sa.event.listen(engine, "before_cursor_execute", keep)
    sa.event.listen(engine, "commit", commit)
    try:
        assert drive(context, notification.id)[-1].outcome is Outcome.ACCEPTED
    finally:
        sa.event.remove(engine, "before_cursor_execute", keep)
        sa.event.remove(engine, "commit", commit)
    assert len(commits) == 2
    # the pool took the connections back as it gave them: the next transaction is one again
    for _ in range(engine.pool.size() if hasattr(engine.pool, "size") else 1):
        with context.sessions.begin() as session:
            assert not autocommit(session)
    if engine.dialect.name == "postgresql":
        assert len(statements) == 3, statements
        # the load, the count of the run and the target, found by the keys the payload holds: one statement
        assert statements[0].startswith("WITH loaded AS") and "LATERAL" in accepted_with[0]
        assert not any(statement.startswith("SET") for statement in statements)
        assert "set_config" in accepted_with[-1] and "message_id" in accepted_with[-1]
        assert (autocommit_at_claim, autocommit_at_accept) == ([True], [True])
    else:  # SQLite keeps its transactions (BEGIN IMMEDIATE): a move is two statements there
        assert (autocommit_at_claim, autocommit_at_accept) == ([False], [False])


def test_round_trips_of_a_warm_send_counted_on_the_wire(sandbox: SandboxProcess, fresh_postgres_url: str,
                                                        clean_environment: pytest.MonkeyPatch) -> None:
    """What PostgreSQL sees of a warm send, counted by a proxy between the two (every turn of the
    client to speak: BEGIN, a statement, COMMIT, a ping): the claim's 2 statements and the
    acceptance's 1, each outside a transaction block, and nothing else: the pool checks a
    connection it hands out by its socket, not by a ping (store.db). 11 with the claim and the
    acceptance in transactions and ``pool_pre_ping``, 7 without the transactions, 5 without the
    pings, 4 with the load and the count of the run as one statement, then 3 with the cached
    target read in it too (by the contact keys stored with the payload at intake)."""
    sandbox.reset()
    url = sa.engine.make_url(fresh_postgres_url)
    with tcp_proxy(url.host or "127.0.0.1", url.port or 5432) as proxy, \
            send_context(example_settings(api_url=sandbox.base_url, database_url=url.set(
                host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False))) as ctx:
        ctx.enqueuer = ListEnqueuer()
        _handed_over_and_sent(ctx, "wire-0", "patient-wire")  # the contact, its source_id and conversation are known now
        intake.accept(parse_request(reminder("wire-1", identifier="patient-wire", phone="+15550418888")),
                      sessions=ctx.sessions, settings=ctx.settings, enqueuer=ListEnqueuer())
        with ctx.sessions() as session:
            notification = store.find_notification_by_event(session, "wire-1")
            assert notification is not None
        before = proxy.round_trips
        assert drive(ctx, notification.id)[-1].outcome is Outcome.ACCEPTED
        assert proxy.round_trips - before == 3


def test_a_lone_delivery_counts_its_run_outside_a_transaction_block(context: SendContext,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer task of one delivery: the count of its run is one guarded statement, so on
    PostgreSQL it runs in autocommit (psycopg sends no BEGIN and no COMMIT: two round trips fewer);
    the outcome, its applied status and the delivery's mark share the one transaction after it.
    SQLite keeps its transactions."""
    _, message_id = _handed_over_and_sent(context, "lone-0", "patient-lone")
    [row] = record_deliveries(context.sessions, [_updated("lone-d", message_id, "delivered")])
    assert row is not None
    autocommit_at_count: list[bool] = []
    start = store.start_delivery_run

    def start_and_look(session: Any, row_id: int) -> Any:
        started = start(session, row_id)
        autocommit_at_count.append(bool(getattr(session.connection().connection.dbapi_connection, "autocommit", False)))
        return started

    monkeypatch.setattr(store, "start_delivery_run", start_and_look)
    assert process_delivery(row, context, context.enqueuer) == "applied_delivered"
    assert autocommit_at_count == [context.sessions.kw["bind"].dialect.name == "postgresql"]
    assert process_delivery(row, context, context.enqueuer) == "already_processed"  # the count refuses a processed row
    with context.sessions.begin() as session:  # the pool took the connection back as it gave it: in a transaction
        assert not getattr(session.connection().connection.dbapi_connection, "autocommit", False)


def test_round_trips_of_a_warm_send_through_a_transaction_pooler(sandbox: SandboxProcess, fresh_postgres_url: str,
                                                                 clean_environment: pytest.MonkeyPatch) -> None:
    """The same warm send through PgBouncer in transaction mode (``database_pooler``), counted
    between the dispatcher and the pooler. Where only a transaction carries the timeouts, the
    claim and the acceptance each run in one, opened by psycopg's BEGIN and the timeouts' one
    statement and closed by COMMIT: 9. Where the server's defaults are the timeouts (here
    ``ALTER DATABASE ... SET``; ``ALTER ROLE`` or PgBouncer's ``connect_query`` do the same), the
    send is the 3 of a direct connection."""
    sandbox.reset()
    counted = []
    with private_pgbouncer(fresh_postgres_url) as bouncer, tcp_proxy("127.0.0.1", bouncer.port) as proxy:
        pooled = sa.engine.make_url(bouncer.url_for(fresh_postgres_url)).set(port=proxy.port)
        upgrade_database(pooled.render_as_string(hide_password=False))
        for number, defaults in enumerate((False, True)):
            if defaults:
                direct = sa.create_engine(fresh_postgres_url, isolation_level="AUTOCOMMIT")
                with direct.connect() as connection:
                    database = sa.engine.make_url(fresh_postgres_url).database
                    connection.execute(sa.text(f'ALTER DATABASE "{database}" SET statement_timeout = 30000'))
                    connection.execute(sa.text(f'ALTER DATABASE "{database}" SET lock_timeout = 10000'))
                direct.dispose()
                _show_reconnect(bouncer.port)
            # an engine of its own (engines are shared by URL): it reads the server's defaults anew
            url = pooled.update_query_dict({"application_name": f"round-{number}"})
            with send_context(example_settings(api_url=sandbox.base_url,
                                               database_url=url.render_as_string(hide_password=False))) as ctx:
                ctx.enqueuer = ListEnqueuer()
                _handed_over_and_sent(ctx, f"pooled-{number}-0", f"patient-pooled-{number}")
                intake.accept(parse_request(reminder(f"pooled-{number}-1", identifier=f"patient-pooled-{number}",
                                                     phone="+15550418889")),
                              sessions=ctx.sessions, settings=ctx.settings, enqueuer=ListEnqueuer())
                with ctx.sessions() as session:
                    notification = store.find_notification_by_event(session, f"pooled-{number}-1")
                    assert notification is not None
                    timeouts = (session.execute(sa.text("SHOW statement_timeout")).scalar_one(),
                                session.execute(sa.text("SHOW lock_timeout")).scalar_one())
                assert timeouts == ("30s", "10s")
                before = proxy.round_trips
                assert drive(ctx, notification.id)[-1].outcome is Outcome.ACCEPTED
                counted.append(proxy.round_trips - before)
    assert counted == [9, 3]


def _show_reconnect(port: int) -> None:
    """PgBouncer's RECONNECT: its server connections are replaced (they read the database's new
    defaults) as each is released. Its admin console speaks the simple protocol only: psql."""
    subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "pgbouncer", "-c", "RECONNECT"],
                   capture_output=True, text=True, timeout=30, check=True)
