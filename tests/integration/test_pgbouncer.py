"""The store through PgBouncer in transaction mode (issue 47; docs/operations.md, "PgBouncer").

A private PgBouncer (tests/support/pgbouncer.py) stands in front of the tests' PostgreSQL with a
server pool of 4, smaller than the connections the processes open, so one client connection's
consecutive transactions run on different server connections. With ``database_pooler =
"transaction"`` the dispatcher prepares no statement on the server and sets its two timeouts in
each transaction; without it, PgBouncer refuses the connection (the ``options`` startup parameter).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from dispatcher.api import WorkspaceClient
from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.lifecycle import moves
from dispatcher.service import Dispatcher
from dispatcher.store.db import make_engine, session_factory
from dispatcher.store.migrate import upgrade_database
from tests.integration.tracking.test_tracking_processes import BEHAVIOUR
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.pgbouncer import SERVER_POOL_SIZE, PrivatePgBouncer, private_pgbouncer
from tests.support.ports import listens
from tests.support.sandbox_process import free_port, running_sandbox
from tests.support.worker_process import dispatcher_environment, fresh_broker_url, process_group, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]



@pytest.fixture()
def bouncer(fresh_postgres_url: str) -> Iterator[PrivatePgBouncer]:
    with private_pgbouncer(fresh_postgres_url) as started:
        yield started


def test_without_the_setting_pgbouncer_refuses_the_connection_and_with_it_nothing_outlives_a_transaction(
        bouncer: PrivatePgBouncer, fresh_postgres_url: str) -> None:
    refused = make_engine(bouncer.url_for(fresh_postgres_url, pooled_setting=False))
    with pytest.raises(sa.exc.OperationalError, match="unsupported startup parameter: options"):
        with refused.connect():
            pass
    refused.dispose()
    engine = make_engine(bouncer.url_for(fresh_postgres_url))
    try:
        with engine.begin() as connection:
            # psycopg prepares a statement on the server once it ran 5 times on a connection
            for _ in range(10):
                connection.execute(sa.text("SELECT 1 WHERE 1 = :one"), {"one": 1})
            prepared = connection.execute(sa.text("SELECT count(*) FROM pg_prepared_statements")).scalar_one()
            timeouts = (connection.execute(sa.text("SHOW statement_timeout")).scalar_one(),
                        connection.execute(sa.text("SHOW lock_timeout")).scalar_one())
        assert prepared == 0
        assert timeouts == ("30s", "10s")  # the dispatcher's, set in this transaction (SET LOCAL)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            # outside a transaction nothing was set: the server connection keeps its own defaults
            assert connection.execute(sa.text("SHOW statement_timeout")).scalar_one() == "0"
    finally:
        engine.dispose()
    # the moves that run alone in autocommit on a direct connection run in a transaction here,
    # where only a transaction carries the timeouts
    for url, alone in ((fresh_postgres_url, True), (bouncer.url_for(fresh_postgres_url), False)):
        either = make_engine(url)
        try:
            with session_factory(either)() as session:
                assert moves.outside_a_transaction(session) is alone
        finally:
            either.dispose()
    migrations = make_engine(bouncer.url_for(fresh_postgres_url), statement_timeout=False)
    try:
        with migrations.begin() as connection:
            assert connection.execute(sa.text("SHOW statement_timeout")).scalar_one() == "0"
    finally:
        migrations.dispose()


def test_the_send_and_tracking_path_through_pgbouncer_settles_every_notification(
        bouncer: PrivatePgBouncer, fresh_postgres_url: str, redis_url: str, tmp_path: Path,
        clean_environment: pytest.MonkeyPatch) -> None:
    """Every process (the receiver, a send worker, two consumers, beat) and the host reach the
    store through PgBouncer, configured as users do: the pooler's address in
    DISPATCHER_DATABASE_URL and DISPATCHER_DATABASE_POOLER=transaction. The migrations run through
    it too. Read, delivered, and a failure that falls back once to SMS."""
    pooled_url = bouncer.url_for(fresh_postgres_url, pooled_setting=False)
    with running_sandbox(BEHAVIOUR) as sandbox:
        broker_url = fresh_broker_url(redis_url)
        receiver_port = free_port()
        env = dispatcher_environment(api_url=sandbox.base_url, database_url=pooled_url, broker_url=broker_url,
                                     DISPATCHER_DATABASE_POOLER="transaction")
        settings = example_settings(api_url=sandbox.base_url, database_url=pooled_url, database_pooler="transaction",
                                    broker_url=broker_url)
        upgrade_database(settings.database_url)
        with WorkspaceClient.from_settings(settings) as client:
            webhook = client.create_webhook(url=f"http://127.0.0.1:{receiver_port}{settings.webhook_path}",
                                            subscriptions=["message_created", "message_updated"])
        assert webhook.secret is not None
        env["DISPATCHER_WEBHOOK_SECRETS"] = webhook.secret.get_secret_value()
        with process_group(env, tmp_path) as group:
            receiver = group.start("receiver", ["-m", "dispatcher", "receiver", "--host", "127.0.0.1",
                                                "--port", str(receiver_port)])
            group.start_worker("sender", concurrency=2)
            for number in range(2):
                group.start_worker(f"consumer{number}", concurrency=2, queues="dispatcher.outcomes")
            group.start_beat()
            wait_until(lambda: _ready(f"http://127.0.0.1:{receiver_port}/readyz") and listens(receiver.pid, receiver_port),
                       timeout_s=30, what="the receiver, ready through PgBouncer")
            dispatcher = Dispatcher(settings, enqueuer=CeleryEnqueuer(broker_url))
            expected: dict[str, tuple[str, str | None]] = {}
            for number in range(12):
                event_id = f"pooled-{number}"
                dispatcher.notify(reminder(event_id, identifier=f"t-pooled-{number}", phone=f"+155505020{number:02d}"))
                expected[event_id] = ("read", None)
            dispatcher.notify(reminder("pooled-undeliverable", identifier="t-pooled-131026", phone="+15550107101"))
            expected["pooled-undeliverable"] = ("delivered", "fallback")

            def settled() -> bool:
                group.ensure_running()
                return all((dispatcher.status(event).state, dispatcher.status(event).fallback_decision) == want
                           for event, want in expected.items())

            try:
                wait_until(settled, timeout_s=120, what="every notification settled through PgBouncer")
            finally:
                print({event: dispatcher.status(event).state for event in expected})
            pools = _show(bouncer, "POOLS")
            logs = group.logs()
        record = dispatcher.status("pooled-undeliverable")
        assert [attempt.route for attempt in record.attempts] == ["reminders", "sms"]
        sms = [m for m in sandbox.messages() if m["inbox_id"] == 2]
        assert len(sms) == 1
    # what transaction mode would break, no process met
    assert "prepared statement" not in logs and "unsupported startup parameter" not in logs
    mine = [row for row in pools if row["database"] == sa.engine.make_url(fresh_postgres_url).database]
    assert mine, pools
    # the processes shared a pool smaller than their connections: transaction mode was really in use
    assert all(int(row["sv_active"]) + int(row["sv_idle"]) + int(row["sv_used"]) + int(row["sv_tested"])
               + int(row["sv_login"]) <= SERVER_POOL_SIZE for row in mine)
    assert sum(int(row["cl_active"]) + int(row["cl_waiting"]) for row in mine) > SERVER_POOL_SIZE


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _show(bouncer: PrivatePgBouncer, what: str) -> list[dict[str, Any]]:
    """PgBouncer's admin console (simple query protocol only: psql, not psycopg)."""
    done = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(bouncer.port), "-U", bouncer.user, "-d", "pgbouncer",
                           "--csv", "-c", f"SHOW {what}"], capture_output=True, text=True, timeout=30, check=True)
    lines = done.stdout.strip().splitlines()
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
