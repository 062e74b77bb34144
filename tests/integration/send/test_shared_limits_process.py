"""A worker on RabbitMQ without a shared limiter refuses to start: one line, exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", ["worker", "consumer"])
def test_a_worker_that_would_keep_limits_of_its_own_refuses_to_start(tmp_path: Path, command: str) -> None:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("DISPATCHER_")}
    environment.update(
        DISPATCHER_API_URL="http://127.0.0.1:9",
        DISPATCHER_ACCOUNT_ID="1",
        DISPATCHER_API_TOKEN="tok-SECRET-123",
        DISPATCHER_DATABASE_URL=f"sqlite:///{tmp_path}/dispatcher.db",
        DISPATCHER_BROKER_URL="amqp://guest:guest@127.0.0.1:5672//",
    )
    dispatcher = Path(sys.executable).with_name("dispatcher")
    ended = subprocess.run([str(dispatcher), command, "--concurrency", "1"], env=environment, cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=120)
    assert ended.returncode == 3
    # Celery may warn first (about running as root, here); the refusal is one line, and the last.
    errors = [line for line in ended.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: DISPATCHER_REDIS_URL (redis_url): is required"), ended.stderr
    assert ended.stderr.strip().splitlines()[-1] == errors[0]
    assert "Traceback" not in ended.stderr + ended.stdout
    assert "tok-SECRET-123" not in ended.stderr + ended.stdout
