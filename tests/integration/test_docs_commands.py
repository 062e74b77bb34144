"""Every shell example in docs/ works as written, or is named here with why it is not run.

Each block runs in a scratch folder that links the checkout's config/, deploy/, docs/ and .venv (so the
embedded store and broker under ./var/ are new), with .venv/bin first on PATH, as for a user who
activated the venv. A server a block starts listens on a free port instead of the one written
(8080, 8090): the commands stay as written. A docs block this test does not know fails it, so a
new example needs its check here. Blocks that need an external service (a Docker engine, a
collector) or run for minutes (benchmarks, chaos runs) are listed with the reason, and each names
the test that covers what it shows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT
from tests.support.ports import listens
from tests.support.sandbox_process import free_port, running_sandbox

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BLOCKS = [(path.name, block.strip()) for path in sorted((REPO_ROOT / "docs").glob("*.md"))
          for block in re.findall(r"```(?:sh|bash|shell|console)\n(.*?)```", path.read_text(), flags=re.DOTALL)]

NOT_RUN = {
    "benchmarks.md": "benchmarks run for minutes each; scripts/bench/all runs them, and "
                     "tests/unit/test_bench_hygiene.py checks each script's options",
    "embedded-broker.md": "a benchmark (scripts/bench/embedded_broker.py), run by scripts/bench/all",
    "chaos.md": "chaos runs take minutes; the README's test command runs tests/chaos itself",
    "scaling.md": "benchmarks that run for minutes (scripts/bench/scale.py about 20 at 10 million rows) and the "
                  "chaos runs; tests/unit/test_bench_hygiene.py checks each script's options",
    "simulation.md": "thousands of seeds over every core, or mutation runs, for minutes to hours; the README's test "
                     "command runs tests/simulation (its seeds, the regression seeds and the exhaustive worlds)",
    "tracing.md": "installs packages and exports to an OpenTelemetry collector this machine does not run; "
                  "tests/integration/tracking/test_traces.py checks one notification's trace",
}
NOT_RUN_OPERATIONS = {
    "# .env": "the content of an .env file, not commands",
    "docker compose": "no Docker engine runs here; tests/unit/test_compose.py checks docker-compose.yml and the "
                      "Dockerfile against the CLI and the settings",
}


def _known(doc: str, block: str) -> str:
    """Which check runs the block, or why none does."""
    if doc in NOT_RUN:
        return "not run"
    if doc == "operations.md":
        for start in NOT_RUN_OPERATIONS:
            if block.startswith(start):
                return "not run"
        if block.startswith("dispatcher list"):
            return "operator commands"
        if block.startswith(("promtool", "prometheus --config.file")):
            return "prometheus"
    known = {("callbacks.md", "dispatcher callbacks list"): "callbacks",
             ("notifications.md", "dispatcher notify"): "hand-over",
             ("notifications.md", "dispatcher reschedule"): "reschedule and cancel",
             ("notifications.md", "dispatcher retry"): "retry",
             ("opt-outs.md", "export DISPATCHER_CONFIG"): "opt-outs",
             ("http-intake.md", "curl"): "http intake",
             ("http-intake.md", "export DISPATCHER_CONFIG"): "http intake",
             ("dashboard.md", "DISPATCHER_CONFIG="): "dashboard"}
    for (known_doc, start), check in known.items():
        if doc == known_doc and block.startswith(start):
            return check
    return "unknown"


def test_every_docs_block_is_run_or_named_with_its_reason() -> None:
    unknown = [(doc, block.splitlines()[0]) for doc, block in BLOCKS if _known(doc, block) == "unknown"]
    assert not unknown, unknown


def _blocks(doc: str, start: str) -> list[str]:
    found = [block for name, block in BLOCKS if name == doc and block.startswith(start)]
    assert found, (doc, start)
    return found


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    for name in ("config", "deploy", "docs"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    return tmp_path


def _environment(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DISPATCHER_")}
    env["PATH"] = f"{Path(sys.prefix) / 'bin'}:{env.get('PATH', '')}"
    env.update(DISPATCHER_CONFIG="config/dispatcher.example.toml", **extra)
    return env


def _run(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def _lines(block: str) -> list[str]:
    """The block's commands, one a line (continuations joined), comments dropped."""
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


Start = Callable[..., None]


@pytest.fixture()
def server(workdir: Path) -> Iterator[Start]:
    started: list[subprocess.Popen[bytes]] = []

    def start(command: str, env: dict[str, str], *, ready: str) -> None:
        with (workdir / f"server-{len(started)}.log").open("wb") as log:
            started.append(subprocess.Popen(["bash", "-c", command], cwd=workdir, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 30
        port = httpx.URL(ready).port
        while time.monotonic() < deadline:
            try:
                httpx.get(ready, timeout=1)
                if port is not None and listens(started[-1].pid, port):  # its own answer, not another test's server's
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        pytest.fail(f"{command!r} did not come up: {(workdir / f'server-{len(started) - 1}.log').read_text()[-2000:]}")

    yield start
    for process in started:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)


def test_the_hand_over_reschedule_cancel_and_retry_examples(workdir: Path) -> None:
    env = _environment()
    [hand_over] = _blocks("notifications.md", "dispatcher notify")
    first, status = (_run(line, workdir, env) for line in _lines(hand_over))
    assert first.returncode == 0 and json.loads(first.stdout) == {"event_id": "appt-2026-0001", "state": "queued"}
    assert status.returncode == 0 and json.loads(status.stdout)["event_id"] == "appt-2026-0001"
    # appt-2026-0002, scheduled, as the reschedule example expects it to be
    scheduled = json.loads((REPO_ROOT / "docs" / "examples" / "reminder.json").read_text())
    scheduled.update(event_id="appt-2026-0002", send_at="2026-12-31T09:00:00+01:00")
    (workdir / "scheduled.json").write_text(json.dumps(scheduled))
    assert _run("dispatcher notify --file scheduled.json", workdir, env).returncode == 0
    [move_and_cancel] = _blocks("notifications.md", "dispatcher reschedule")
    moved, cancelled = (_run(line, workdir, env) for line in _lines(move_and_cancel))
    assert moved.returncode == 0 and "scheduled for 2026-12-01T08:00:00+00:00" in moved.stdout, moved.stderr
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == "appt-2026-0002: cancelled"
    [retry] = _blocks("notifications.md", "dispatcher retry")
    refused = _run(_lines(retry)[0], workdir, env)  # queued, not failed: the documented refusal
    assert refused.returncode == 1 and refused.stderr.strip().startswith("error: notification 'appt-2026-0001' is queued")


def test_the_callbacks_and_opt_out_examples(workdir: Path) -> None:
    # callbacks on (to a URL nobody answers: the events wait, and the replay finds them)
    env = _environment(DISPATCHER_CALLBACK_URL="http://127.0.0.1:9/callbacks",
                       DISPATCHER_CALLBACK_SECRETS="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    assert _run("dispatcher notify --file docs/examples/reminder.json", workdir, env).returncode == 0
    assert _run("dispatcher cancel appt-2026-0001", workdir, env).returncode == 0  # an event to tell: cancelled
    [callbacks] = _blocks("callbacks.md", "dispatcher callbacks list")
    for line in _lines(callbacks):
        result = _run(line, workdir, env)
        assert result.returncode == 0 and "Traceback" not in result.stderr, (line, result.stderr)
    [opt_outs] = _blocks("opt-outs.md", "export DISPATCHER_CONFIG")
    result = _run(opt_outs, workdir, env)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "+15551234567" not in result.stdout + result.stderr  # keys are hashes: the number is never printed


def test_the_operator_commands_example(workdir: Path) -> None:
    with running_sandbox() as sandbox:
        env = _environment(DISPATCHER_API_URL=sandbox.base_url)
        assert _run("dispatcher notify --file docs/examples/reminder.json", workdir, env).returncode == 0
        [commands] = _blocks("operations.md", "dispatcher list")
        failed, reminders, hooks = (_run(line, workdir, env) for line in _lines(commands))
    assert failed.returncode == 0 and failed.stderr.strip() == "no notifications"
    assert reminders.returncode == 0 and json.loads(reminders.stdout)["event_id"] == "appt-2026-0001"
    assert hooks.returncode == 0 and hooks.stdout == ""  # a new sandbox has no webhook yet


def test_the_http_intake_examples(workdir: Path, server: Start) -> None:
    port = free_port()
    [running] = _blocks("http-intake.md", "export DISPATCHER_CONFIG")
    script = running.replace("--port 8080", f"--port {port}")
    prepare, serve = script.rsplit(".venv/bin/dispatcher db upgrade", 1)
    token_line = next(line for line in prepare.splitlines() if "DISPATCHER_INTAKE_TOKEN" in line)
    token = _run(f"{token_line}; echo \"$DISPATCHER_INTAKE_TOKEN\"", workdir, _environment()).stdout.strip()
    env = _environment(DISPATCHER_INTAKE_TOKEN=token)
    assert _run(".venv/bin/dispatcher db upgrade", workdir, env).returncode == 0
    server(serve.replace("\\\n", " ").strip(), env, ready=f"http://127.0.0.1:{port}/healthz")
    answers = {}
    for block in _blocks("http-intake.md", "curl"):
        command = " ".join(_lines(block)).replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        result = _run(command + " -o /dev/null -w '%{http_code}'" if " -i" not in command else command, workdir, env)
        assert result.returncode == 0, (command, result.stderr)
        answers[block.split("\n")[0][:60]] = result.stdout
    statuses = list(answers.values())
    assert statuses[0].startswith("HTTP/1.1 202")  # handed over
    # the batch (a duplicate item), the read, DELETE (cancelled), PATCH and the retry of a cancelled one (409)
    assert statuses[1:] == ["200", "200", "200", "409", "409"], answers


def test_the_dashboard_example(workdir: Path, server: Start) -> None:
    port = free_port()
    assert _run("dispatcher db upgrade", workdir, _environment()).returncode == 0  # a store to show
    [block] = _blocks("dashboard.md", "DISPATCHER_CONFIG=")
    command = " ".join(_lines(block)).replace("--port 8090", f"--port {port}")
    server(command, _environment(), ready=f"http://127.0.0.1:{port}/")
    token = re.search(r"DISPATCHER_OPERATOR_TOKEN=(\S+)", command)
    assert token is not None
    assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 401
    assert httpx.get(f"http://127.0.0.1:{port}/", auth=("operator", token[1])).status_code == 200


def test_the_prometheus_examples(workdir: Path, server: Start) -> None:
    [checks] = _blocks("operations.md", "promtool")
    for line in _lines(checks):
        result = _run(line, workdir, _environment())
        assert result.returncode == 0 and "SUCCESS" in result.stdout, (line, result.stdout, result.stderr)
    port = free_port()
    [running] = _blocks("operations.md", "prometheus --config.file")
    command = " ".join(_lines(running)).replace("127.0.0.1:9090", f"127.0.0.1:{port}")
    server(command, _environment(), ready=f"http://127.0.0.1:{port}/-/ready")
    groups = httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert len([rule for group in groups for rule in group["rules"]]) == 7  # the shipped rules, loaded
    assert (workdir / "var" / "prometheus").is_dir()  # its data where the docs say
