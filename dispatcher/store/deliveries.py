"""Webhook deliveries as the receiver stores them: once by delivery ID, a burst in one statement.

``INSERT ... ON CONFLICT (delivery_id) DO NOTHING RETURNING id, delivery_id`` (SQLite and
PostgreSQL): a delivery ID the service retries is no exception, and the receiver learns which rows
are new. The statement is built once per row count (SQLAlchemy would compile it for every burst).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from dispatcher.store.built_once import BuiltOnce, built_once
from dispatcher.store.db import dialect_insert
from dispatcher.store.models import WebhookDelivery, table_of

DELIVERIES_AT_ONCE = 64  # rows of one INSERT: a receiver's burst is one statement
_TABLE = table_of(WebhookDelivery)
_COLUMNS = ("delivery_id", "event", "summary", "received_at", "workspace", "message_id")


@dataclass(frozen=True, slots=True)
class StoredDelivery:
    """One verified delivery as its row holds it: IDs and status, no personal data."""

    delivery_id: str
    event: str
    summary: dict[str, Any]
    received_at: datetime
    workspace: str
    message_id: int | None  # indexed: a notification's page finds its webhooks


def row_of(session: Session, delivery_id: str) -> int | None:
    """The row a delivery ID was recorded as, if it was."""
    return session.execute(select(_TABLE.c.id).where(_TABLE.c.delivery_id == delivery_id)).scalar_one_or_none()


def insert_new(session: Session, deliveries: Sequence[StoredDelivery]) -> dict[str, int]:
    """Insert the deliveries whose ID is not stored yet (IDs distinct); their new row IDs by delivery
    ID. The caller commits."""
    inserted: dict[str, int] = {}
    for start in range(0, len(deliveries), DELIVERIES_AT_ONCE):  # a burst: one statement (a larger one, a few)
        chunk = deliveries[start:start + DELIVERIES_AT_ONCE]
        parameters = {f"{column}_{row}": getattr(delivery, column)
                      for row, delivery in enumerate(chunk) for column in _COLUMNS}
        inserted.update({delivery_id: row_id for row_id, delivery_id
                         in session.execute(_insert_statement(len(chunk))(session), parameters)})
    return inserted


@functools.cache
def _insert_statement(rows: int) -> BuiltOnce:
    """The INSERT of ``rows`` deliveries (multi-row VALUES, at most :data:`DELIVERIES_AT_ONCE`)."""
    values = [{column: bindparam(f"{column}_{row}", type_=_TABLE.c[column].type) for column in _COLUMNS}
              for row in range(rows)]
    return built_once(lambda dialect: dialect_insert(dialect)(_TABLE).values(values)
                      .on_conflict_do_nothing(index_elements=["delivery_id"])
                      .returning(_TABLE.c.id, _TABLE.c.delivery_id))
