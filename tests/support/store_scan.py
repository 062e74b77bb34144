"""Scan every text column of the dispatcher's store for values that must not be kept there."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.store.models import Base


def kept_anywhere(sessions: sessionmaker[Session], needles: Iterable[str]) -> list[str]:
    """``table.column: needle`` for each needle found in any string or JSON column of any table."""
    wanted = [needle for needle in needles if needle]
    found: list[str] = []
    with sessions() as session:
        for table in Base.metadata.sorted_tables:
            columns = [column for column in table.columns if isinstance(column.type, sa.String | sa.JSON)]
            for column in columns:
                for value in session.scalars(sa.select(sa.cast(column, sa.Text)).where(column.is_not(None))):
                    found += [f"{table.name}.{column.name}: {needle}" for needle in wanted if needle in value]
    assert Base.metadata.tables, "the scan must see the store's tables"
    return found
