"""The Alembic migrations build exactly the tables the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from dispatcher.store.db import make_engine
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Base

pytestmark = pytest.mark.integration


def _differences(url: str) -> list[object]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def test_sqlite_schema_matches_the_models_and_upgrade_is_repeatable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/schema.sqlite"
    upgrade_database(url)
    upgrade_database(url)  # a second run changes nothing and does not fail
    assert _differences(url) == []


def test_postgres_schema_matches_the_models(fresh_postgres_url: str) -> None:
    upgrade_database(fresh_postgres_url)
    assert _differences(fresh_postgres_url) == []
    engine = make_engine(fresh_postgres_url)
    try:
        with engine.connect() as connection:
            version = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
        assert version == "0022"
    finally:
        engine.dispose()


def _execute(url: str, *statements: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(sa.text(statement))
    finally:
        engine.dispose()


def _rows_before_instances(url: str) -> None:
    """A database at 0016 with a workspace's sent attempt, its applied status and an opt-out."""
    upgrade_database(url, "0016")
    _execute(url,
             "INSERT INTO notifications (id, event_id, fingerprint, route, state, created_at, updated_at, workspace) "
             "VALUES (7, 'e-7', 'f', 'sms', 'sent', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 'north')",
             "INSERT INTO attempts (notification_id, number, purpose, route, channel, state, message_id, tries, "
             "runs, claims, created_at, updated_at) "
             "VALUES (7, 1, 'first', 'sms', 'sms', 'sent', 41, 0, 0, 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
             "INSERT INTO applied_statuses (message_id, status, applied_at) VALUES (41, 'sent', CURRENT_TIMESTAMP)",
             "INSERT INTO suppressions (account_id, recipient_key, channel, category, reason, since) "
             "VALUES (3, 'k', '*', '*', 'host', CURRENT_TIMESTAMP)")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_0017_keeps_what_was_there_under_its_workspace_and_instance(store: str, tmp_path: Path,
                                                                     request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path}/before.sqlite" if store == "sqlite" else request.getfixturevalue("fresh_postgres_url")
    _rows_before_instances(url)
    upgrade_database(url)
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            assert connection.execute(sa.text("SELECT workspace FROM attempts")).scalar_one() == "north"
            assert connection.execute(sa.text("SELECT workspace FROM applied_statuses")).scalar_one() == "north"
            assert connection.execute(sa.text("SELECT instance, account_id FROM suppressions")).one() == ("default", 3)
            # another instance's account 3 may now hold the same key, and another workspace message 41
            connection.execute(sa.text(
                "INSERT INTO suppressions (instance, account_id, recipient_key, channel, category, reason, since) "
                "VALUES ('south', 3, 'k', '*', '*', 'host', CURRENT_TIMESTAMP)"))
            connection.execute(sa.text(
                "INSERT INTO applied_statuses (workspace, message_id, status, applied_at) "
                "VALUES ('south', 41, 'sent', CURRENT_TIMESTAMP)"))
    finally:
        engine.dispose()
    assert _differences(url) == []


def test_0017_is_undone_on_one_instance_and_refused_with_two(tmp_path: Path) -> None:
    from alembic import command

    from dispatcher.store.migrate import alembic_config

    url = f"sqlite:///{tmp_path}/down.sqlite"
    _rows_before_instances(url)
    upgrade_database(url)
    command.downgrade(alembic_config(url), "0016")  # every row is the top-level instance's: it goes back
    upgrade_database(url)
    _execute(url, "INSERT INTO suppressions (instance, account_id, recipient_key, channel, category, reason, since) "
                  "VALUES ('south', 3, 'k', '*', '*', 'host', CURRENT_TIMESTAMP)")
    with pytest.raises(RuntimeError, match="separate instances"):
        command.downgrade(alembic_config(url), "0016")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_0020_and_0021_read_existing_rows_as_not_started_and_normal_and_keep_their_attempts(store: str, tmp_path: Path,
                                                                          request: pytest.FixtureRequest) -> None:
    # (a rebuilt notifications table would lose them on SQLite: dropping it cascades to attempts)
    url = f"sqlite:///{tmp_path}/before.sqlite" if store == "sqlite" else request.getfixturevalue("fresh_postgres_url")
    _rows_before_instances(url)
    upgrade_database(url, "0018")
    upgrade_database(url)
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            started = connection.execute(sa.select(sa.column("task_started", sa.Boolean()))
                                         .select_from(sa.table("notifications"))).scalar_one()
            assert started is False
            # 0021: every notification from before is normal (issue 45), and nothing was rebuilt
            assert connection.execute(sa.text("SELECT priority FROM notifications")).scalar_one() == "normal"
            assert connection.execute(sa.text("SELECT count(*) FROM attempts")).scalar_one() == 1
    finally:
        engine.dispose()
