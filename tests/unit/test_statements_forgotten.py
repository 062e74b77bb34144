"""A statement built once is built anew after forget_built_statements (what the mutation run uses
so that a mutant of a statement's builder reaches every test that runs the statement)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from dispatcher.store.built_once import built_once, forget_built_statements


def test_a_forgotten_statement_is_built_again_at_its_next_run() -> None:
    builds: list[str] = []

    @built_once
    def answer(dialect: str) -> Any:
        builds.append(dialect)
        return sa.select(sa.literal(len(builds)).label("n"))

    engine = sa.create_engine("sqlite://")
    with engine.connect() as connection:
        first = connection.execute(answer(connection)).scalar_one()
        again = connection.execute(answer(connection)).scalar_one()
        forget_built_statements()
        rebuilt = connection.execute(answer(connection)).scalar_one()
    assert (first, again, rebuilt) == (1, 1, 2)
    assert builds == ["sqlite", "sqlite"]
