"""Where state and work live: the database, the broker, and the Redis of the shared limiter."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dispatcher.queues import DEFAULT_VISIBILITY_TIMEOUT_S
from dispatcher.settings.checks import ENV_PREFIX, Concern
from dispatcher.store.db import POOLER_PARAMETER

DEFAULT_DATABASE_URL = "sqlite:///var/dispatcher.sqlite"
DEFAULT_BROKER_URL = "filesystem://var/broker"  # see docs/embedded-broker.md


class Storage(Concern):
    # Hidden from repr: a URL may carry a password.
    database_url: str = Field(default=DEFAULT_DATABASE_URL, repr=False)
    broker_url: str = Field(default=DEFAULT_BROKER_URL, repr=False)
    redis_url: str | None = Field(default=None, repr=False)  # shared limiter; default: the broker when it is Redis
    # Redis broker: a task a worker took and never acknowledged (it was killed whole) comes back
    # after this, plus one restore period (dispatcher.queues): a lost worker's work within 60 s.
    broker_visibility_timeout_s: int = Field(default=DEFAULT_VISIBILITY_TIMEOUT_S, gt=0)
    # A pooler between the processes and PostgreSQL that hands a server connection out for one
    # transaction at a time (PgBouncer's pool_mode = transaction): "transaction" keeps every
    # connection to what such a pooler carries (docs/operations.md, "PgBouncer").
    database_pooler: Literal["none", "transaction"] = "none"

    @model_validator(mode="before")
    @classmethod
    def _pooler_in_the_url(cls, data: Any) -> Any:
        """Every process and command opens its engine from the database URL alone, so the pooler's
        mode travels in it, as the ``dispatcher_pooler`` parameter that store.db.make_engine reads
        (and takes out: PostgreSQL never sees it)."""
        if not isinstance(data, dict) or data.get("database_pooler") != "transaction":
            return data
        url = str(data.get("database_url") or "")
        if url.startswith("sqlite") or not url:
            raise ValueError(f"{ENV_PREFIX}DATABASE_POOLER (database_pooler): a pooler stands in front of PostgreSQL, "
                             "and database_url is not PostgreSQL")
        if POOLER_PARAMETER not in url:
            url += ("&" if "?" in url else "?") + f"{POOLER_PARAMETER}=transaction"
        return {**data, "database_url": url}

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, value: str) -> str:
        """SQLite or PostgreSQL through psycopg 3 (the driver installed); postgresql:// means that."""
        scheme, separator, rest = value.strip().partition("://")
        if scheme in ("postgresql", "postgres"):
            return f"postgresql+psycopg://{rest}"
        if not separator or scheme not in ("sqlite", "postgresql+psycopg"):
            raise ValueError("must be sqlite:///path/to/file.sqlite or postgresql+psycopg://user@host/database "
                             "(the stores the dispatcher supports)")
        return value.strip()

    @property
    def limiter_redis_url(self) -> str | None:
        """Where the shared rate limiter lives: redis_url, else a Redis broker, else nowhere."""
        if self.redis_url:
            return self.redis_url
        return self.broker_url if self.broker_url.startswith(("redis://", "rediss://")) else None
