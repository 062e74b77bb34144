"""Bring a database to the newest schema with Alembic; the scripts ship inside the package."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade_database(database_url: str, revision: str = "head") -> None:
    """Create or upgrade every table; safe to run again (Alembic records what it applied)."""
    from dispatcher.store.db import make_engine

    engine = make_engine(database_url, statement_timeout=False)
    try:
        with engine.begin() as connection:
            config = alembic_config(database_url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()
