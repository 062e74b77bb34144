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
        assert version == "0016"
    finally:
        engine.dispose()
