"""The send path's fixtures: a sandbox process per module and a send context over a fresh store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.context import SendContext
from tests.support.dispatcher_setup import example_settings, send_context
from tests.support.sandbox_process import SandboxProcess, running_sandbox


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with running_sandbox() as process:
        yield process


@pytest.fixture()
def context(sandbox: SandboxProcess, tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Iterator[SendContext]:
    """The example configuration against the sandbox (reset first), on a SQLite store of its own."""
    sandbox.reset()
    settings = example_settings(api_url=sandbox.base_url, database_url=f"sqlite:///{tmp_path}/dispatcher.sqlite")
    with send_context(settings) as ctx:
        yield ctx
