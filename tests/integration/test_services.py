"""The real services the integration tests rely on answer on loopback: PostgreSQL (scripts/test
starts it) and the suite's own Redis."""

from __future__ import annotations

import os

import pytest
import redis
import sqlalchemy as sa

pytestmark = pytest.mark.integration


def test_postgres_database_is_ours_and_writable(postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE probe (id integer primary key)"))
            connection.execute(sa.text("INSERT INTO probe VALUES (7)"))
            assert connection.execute(sa.text("SELECT id FROM probe")).scalar_one() == 7
            assert connection.execute(sa.text("SELECT current_database()")).scalar_one().startswith("dispatcher_test_")
    finally:
        engine.dispose()


def test_redis_answers_and_round_trips(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    key = "dispatcher-test:probe"
    client.set(key, "1", ex=10)
    assert client.get(key) == b"1"
    client.delete(key)


def test_the_suite_uses_a_redis_of_its_own_unless_given_one(redis_url: str) -> None:
    # The machine's Redis on 6379 may hold someone else's data, and the tests flush what they use.
    if os.environ.get("DISPATCHER_TEST_REDIS_URL"):
        assert redis_url == os.environ["DISPATCHER_TEST_REDIS_URL"]
    else:
        assert redis.Redis.from_url(redis_url).config_get("port")["port"] != "6379"
