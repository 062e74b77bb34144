"""Every command the README shows works as written.

Each shell block of the README runs in a scratch folder that links the checkout's config/,
docs/ and .venv, so ./var/ is made fresh. The sandbox runs on a free port instead of 3000 (the
environment's DISPATCHER_API_URL points there; the commands stay as written). A README block this
test does not know fails it: a new command needs its check here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT
from tests.support.ports import listens
from tests.support.sandbox_process import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

README = (REPO_ROOT / "README.md").read_text()
BLOCKS = [block.strip() for block in re.findall(r"```sh\n(.*?)```", README, flags=re.DOTALL)]


def _block(starting: str) -> str:
    matches = [block for block in BLOCKS if block.startswith(starting)]
    assert len(matches) == 1, f"expected one README block starting {starting!r}"
    return matches[0]


SETUP = _block("bash scripts/demo")
SANDBOX = _block(".venv/bin/dispatcher sandbox")
EMBEDDED = _block("export DISPATCHER_CONFIG=")
CONFIG = _block("DISPATCHER_CONFIG=config/dispatcher.example.toml .venv/bin/dispatcher config check")
COMMANDS = _block(".venv/bin/dispatcher demo")
HELP_ONLY = _block(".venv/bin/dispatcher inboxes --help")


def test_every_readme_block_is_checked_here() -> None:
    assert sorted(BLOCKS) == sorted([SETUP, SANDBOX, EMBEDDED, CONFIG, COMMANDS, HELP_ONLY])


def test_the_help_block_runs_as_written(workdir: Path) -> None:
    for line in HELP_ONLY.splitlines():
        result = _run(line, workdir, _environment())
        assert result.returncode == 0, (line, result.stderr)
        assert "Example" in result.stdout, line


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    for name in ("config", "docs"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))  # the venv running the tests
    return tmp_path


def _environment(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DISPATCHER_") or key.startswith("DISPATCHER_TEST_")}
    env.update(extra)
    return env


def _run(script: str, cwd: Path, env: dict[str, str], *, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


@pytest.fixture()
def readme_sandbox(workdir: Path) -> Iterator[str]:
    """The README's sandbox command, on a free port; yields its base URL."""
    port = free_port()
    command = SANDBOX.split("  #")[0].replace("--port 3000", f"--port {port}")
    log_path = workdir / "sandbox.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=workdir, env=_environment(),
                                   stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            # its own answer, not that of another test's server that took the port first
            if httpx.get(f"{base_url}/_sandbox/health", timeout=1).status_code == 200 and listens(process.pid, port):
                break
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    else:
        process.kill()
        process.wait()
        pytest.fail(f"the README's sandbox command did not come up: {log_path.read_text(errors='replace')[-2000:]}")
    try:
        yield base_url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)


def test_config_check_commands(workdir: Path) -> None:
    first, second = CONFIG.splitlines()
    ok = _run(first, workdir, _environment())
    assert ok.returncode == 0, ok.stderr
    assert "configuration OK" in ok.stdout
    bad = _run(second, workdir, _environment())
    assert bad.returncode == 3
    assert "error: DISPATCHER_ACCOUNT_ID (account_id): Input should be a valid integer" in bad.stderr


def test_embedded_walkthrough(workdir: Path, readme_sandbox: str) -> None:
    lines = EMBEDDED.splitlines()
    notify_at = next(n for n, line in enumerate(lines) if " notify " in line)
    setup = "\n".join(["set -e", *lines[: notify_at + 1]])
    env = _environment(DISPATCHER_API_URL=readme_sandbox)
    try:
        done = _run(setup, workdir, env)
        assert done.returncode == 0, done.stderr
        assert '{"event_id": "appt-2026-0001", "state": "queued"}' in done.stdout
        deadline = time.monotonic() + 60
        while True:
            status = _run("\n".join(["set -e", lines[0], *lines[notify_at + 1 :]]), workdir, env)
            assert status.returncode == 0, status.stderr
            if re.search(r"^message\s+\d+", status.stdout, flags=re.MULTILINE):
                break
            assert time.monotonic() < deadline, f"never sent: {status.stdout}"
            time.sleep(0.5)
        assert "appt-2026-0001" in status.stdout.splitlines()[-1]  # `list --state sent` shows it
        again = _run("\n".join(["set -e", lines[0], lines[notify_at]]), workdir, env)
        assert '"event_id": "appt-2026-0001"' in again.stdout and '"queued"' not in again.stdout
    finally:
        pid_file = workdir / "var" / "worker.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            deadline = time.monotonic() + 15
            while pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.2)


def test_commands_block(workdir: Path, readme_sandbox: str) -> None:
    demo, inboxes = COMMANDS.splitlines()
    # the demo, twice in a row on the same var/: the second run sends to the same patients again,
    # through the restarted sandbox that kept their contacts and conversations
    tables = []
    for run in (1, 2):
        result = _run(demo, workdir, _environment(), timeout_s=150)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"demo run {run} in {workdir / 'var' / 'demo'}" in result.stdout
        assert "all states as expected" in result.stdout
        tables.append([line.split()[0] for line in result.stdout.splitlines() if line.startswith("appt-")])
    assert "records restored" in (workdir / "var" / "demo" / "logs" / "sandbox.log").read_text()
    assert tables[1] == [f"{event_id}-run2" for event_id in tables[0]]
    assert "appt-1007" in tables[0]  # the follow-up that the patient's reply let go out as free text
    listed = _run(inboxes, workdir, _environment(DISPATCHER_API_URL=readme_sandbox))
    assert listed.returncode == 0, listed.stderr
    assert "route reminders: inbox 1 (WhatsApp Reminders)" in listed.stdout
    assert "NO MATCHING INBOX" not in listed.stderr


def test_help_of_every_command_named_in_the_readme(workdir: Path) -> None:
    commands = "sandbox|worker|consumer|receiver|beat|flower|notify|status|list|webhooks register|db upgrade|config check|demo|inboxes"
    named = set(re.findall(rf"`({commands})`", README))
    assert set(commands.split("|")) == named, "the README names every command"
    for command in named:
        result = _run(f".venv/bin/dispatcher {command} --help", workdir, _environment())
        assert result.returncode == 0, (command, result.stderr)
        assert "Example" in result.stdout, command
