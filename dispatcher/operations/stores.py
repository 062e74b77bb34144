"""The store an operator's command reads: there, or said in one line."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url

from dispatcher.errors import ConfigurationError


def require_existing_store(database_url: str) -> None:
    """ConfigurationError when ``database_url`` names a SQLite file that does not exist: a command
    that reads or changes what is stored would otherwise make an empty store at a wrong path and
    answer as if nothing were there. Any other store is asked when used."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not Path(url.database).exists():
        raise ConfigurationError("DISPATCHER_DATABASE_URL (database_url)", "names a SQLite file that does not exist "
                                 "(nothing was handed over with this configuration yet, or the path is wrong)")
