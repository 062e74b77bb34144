"""Fixtures shared by every test folder.

Real services are not optional: when PostgreSQL or Redis does not answer, the tests that need
them fail (they are never skipped), as `scripts/test` starts both before pytest runs.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"


@pytest.fixture(autouse=True)
def _statements_built_anew_for_each_mutant() -> None:
    """Under mutmut (the mutation run sets MUTANT_UNDER_TEST), each test builds the hot paths'
    statements itself: the mutants of their builders then reach every test that runs them."""
    if "MUTANT_UNDER_TEST" in os.environ:
        from dispatcher.store.built_once import forget_built_statements

        forget_built_statements()


@pytest.fixture()
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No DISPATCHER_* variable from the outer shell may leak into a test."""
    for name in list(os.environ):
        if name.startswith("DISPATCHER_") and not name.startswith("DISPATCHER_TEST_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    with _fresh_postgres_database() as url:
        yield url


@pytest.fixture()
def fresh_postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for one test, dropped after it."""
    with _fresh_postgres_database() as url:
        yield url


@contextlib.contextmanager
def _fresh_postgres_database() -> Iterator[str]:
    import sqlalchemy as sa

    admin_url = os.environ.get(
        "DISPATCHER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    name = f"dispatcher_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as error:
        pytest.fail(f"PostgreSQL does not answer at the test URL (run the tests with scripts/test): {error}")
    url = sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Redis the tests use: the URL in ``DISPATCHER_TEST_REDIS_URL``, else a server of the
    suite's own on a free port, stopped at the end. Never the machine's server on 6379 unasked:
    the tests flush the databases they use, and must flush only what they created."""
    import redis

    from tests.support.redis_server import PrivateRedis

    given = os.environ.get("DISPATCHER_TEST_REDIS_URL")
    if given:
        try:
            redis.Redis.from_url(given, socket_timeout=2).ping()
        except redis.RedisError as error:
            pytest.fail(f"Redis does not answer at DISPATCHER_TEST_REDIS_URL: {type(error).__name__}")
        yield given
        return
    own = PrivateRedis(tmp_path_factory.mktemp("redis"))
    own.start()
    try:
        yield own.url.removesuffix("/0")
    finally:
        own.stop()
