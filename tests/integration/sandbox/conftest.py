"""Fixtures for the sandbox integration tests (helpers live in sandbox_helpers.py).

Do not add an ``__init__.py`` here: this folder would become a package named ``sandbox`` and shadow
the real one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_helpers import FAST_CONFIG, Api, WebhookReceiver

from tests.support.sandbox_process import (  # noqa: F401  (fixtures)
    SandboxProcess,
    contract_sandbox,
    contract_sandbox_session,
    running_sandbox,
    sandbox,
    sandbox_session,
)


@pytest.fixture()
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver()
    hook.start()
    try:
        yield hook
    finally:
        hook.stop()


@pytest.fixture(scope="module")
def fast_sandbox_session() -> Iterator[SandboxProcess]:
    with running_sandbox(FAST_CONFIG) as handle:
        yield handle


@pytest.fixture()
def fast_sandbox(fast_sandbox_session: SandboxProcess) -> SandboxProcess:
    """A sandbox with 0.05 s channel delays, reset before each test."""
    fast_sandbox_session.reset()
    return fast_sandbox_session


@pytest.fixture()
def api(sandbox: SandboxProcess) -> Iterator[Api]:
    client = Api(sandbox)
    yield client
    client.close()


@pytest.fixture()
def contract_api(contract_sandbox: SandboxProcess) -> Iterator[Api]:
    client = Api(contract_sandbox)
    yield client
    client.close()


@pytest.fixture()
def fast_api(fast_sandbox: SandboxProcess) -> Iterator[Api]:
    client = Api(fast_sandbox)
    yield client
    client.close()


