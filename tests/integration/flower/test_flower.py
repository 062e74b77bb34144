"""Flower with real parts: `dispatcher flower`, a Celery worker process, Redis, PostgreSQL and the sandbox.

Notifications are sent for real, then read back from Flower's HTTP API: the send tasks are there
with their states and their arguments are IDs only; no phone number, content or token appears in
anything Flower answers. The first tests check the command's own decisions without starting Flower.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.operations.cli import flower_command as flower_module
from dispatcher.operations.cli.flower_command import flower_command
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings
from dispatcher.store.migrate import upgrade_database
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.sandbox_process import DEFAULT_TOKEN, SandboxProcess, free_port, running_sandbox
from tests.support.worker_process import ProcessGroup, dispatcher_environment, fresh_broker_url, process_group, wait_until

EXAMPLE = str(REPO_ROOT / "config" / "dispatcher.example.toml")
SEND_TASK = "dispatcher.send"
FLOWER_USER = "ops"


# -- the command's decisions, without starting anything ----------------------------------------

class _Exec(Exception):
    def __init__(self, argv: list[str]) -> None:
        super().__init__("exec")
        self.argv = argv


@pytest.fixture()
def exec_calls(clean_environment: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """`os.execv` records its argv instead of replacing the test process."""
    clean_environment.setenv("DISPATCHER_CONFIG", EXAMPLE)
    for name in ("FLOWER_BASIC_AUTH", "FLOWER_AUTH"):
        clean_environment.delenv(name, raising=False)

    def fake_execv(_path: str, argv: list[str]) -> None:
        raise _Exec(list(argv))

    clean_environment.setattr(flower_module.os, "execv", fake_execv)
    return clean_environment


def _run(arguments: list[str], env: dict[str, str] | None = None) -> tuple[int, str, list[str] | None]:
    result = CliRunner().invoke(flower_command, arguments, env=env, prog_name="dispatcher flower")
    argv = result.exception.argv if isinstance(result.exception, _Exec) else None
    return result.exit_code, result.output, argv


def test_flower_execs_celery_flower_read_only_on_loopback_by_default(exec_calls: pytest.MonkeyPatch) -> None:
    _code, _output, argv = _run(["--url_prefix=flower"])
    assert argv is not None
    assert argv[1:7] == ["-m", "celery", "-A", "workers.app", "flower", "--port=5555"]
    assert "--address=127.0.0.1" in argv
    assert "--read_only=True" in argv
    assert "--persistent=False" in argv
    assert "--purge_offline_workers=600" in argv
    assert argv[-1] == "--url_prefix=flower"


def test_allow_control_turns_read_only_off(exec_calls: pytest.MonkeyPatch) -> None:
    _code, _output, argv = _run(["--allow-control", "--port", "5600", "--purge-offline-after", "0"])
    assert argv is not None
    assert "--read_only=False" in argv and "--port=5600" in argv
    assert not any(part.startswith("--purge_offline_workers") for part in argv)


def test_another_address_needs_basic_auth_from_the_environment(exec_calls: pytest.MonkeyPatch) -> None:
    code, output, argv = _run(["--address", "0.0.0.0"])
    assert code == 2 and argv is None
    assert "FLOWER_BASIC_AUTH" in output
    _code, _output, argv = _run(["--address", "0.0.0.0"], env={"FLOWER_BASIC_AUTH": "ops:s3cret-value"})
    assert argv is not None and "--address=0.0.0.0" in argv
    assert not any("s3cret-value" in part for part in argv), "the credential must stay out of argv"
    _code, _output, argv = _run(["--address", "0.0.0.0", "--allow-unauthenticated"])
    assert argv is not None


def test_a_credential_on_the_command_line_is_refused_without_repeating_it(exec_calls: pytest.MonkeyPatch) -> None:
    code, output, argv = _run(["--basic-auth=ops:s3cret-value"])
    assert code == 2 and argv is None
    assert "FLOWER_BASIC_AUTH" in output and "s3cret-value" not in output


def test_a_malformed_basic_auth_is_refused_without_repeating_it(exec_calls: pytest.MonkeyPatch) -> None:
    code, output, argv = _run([], env={"FLOWER_BASIC_AUTH": "ops-without-password-s3cret"})
    assert code == 2 and argv is None
    assert "FLOWER_BASIC_AUTH" in output and "s3cret" not in output


def test_a_bad_setting_fails_before_flower_starts(exec_calls: pytest.MonkeyPatch) -> None:
    exec_calls.setenv("DISPATCHER_ACCOUNT_ID", "abc")
    _code, _output, argv = _run([])
    assert argv is None


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(flower_command, ["--help"], prog_name="dispatcher flower")
    assert result.exit_code == 0
    assert "Example" in result.output and "FLOWER_BASIC_AUTH" in result.output


# -- a real Flower ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with running_sandbox() as process:
        yield process


def _settings_from(env: dict[str, str]) -> Settings:
    overrides = {key.removeprefix("DISPATCHER_").lower(): value for key, value in env.items()
                 if key.startswith("DISPATCHER_") and key != "DISPATCHER_CONFIG" and not key.startswith("DISPATCHER_TEST_")}
    return example_settings(**overrides)


def _phone(number: int) -> str:
    return f"+1555042{number:04d}"


def _notification_ids(database_url: str, event_ids: list[str]) -> dict[str, int]:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT event_id, id FROM notifications WHERE event_id = ANY(:events)"), {"events": event_ids}
            ).all()
    finally:
        engine.dispose()
    return {str(event_id): int(row_id) for event_id, row_id in rows}


def _args_ids(args: str | None) -> set[int]:
    """The notification IDs in a task's shown arguments: `(notification=42)` or the bare list `[42]`."""
    match = re.fullmatch(r"\(notification=(\d+)\)|\[(\d+)\]", args or "")
    assert match, f"a send task shows arguments other than one notification ID: {args!r}"
    return {int(match.group(1) or match.group(2))}


class FlowerApi:
    """Flower's HTTP API with basic auth; keeps every body it read for the privacy check."""

    def __init__(self, base_url: str, password: str) -> None:
        self.client = httpx.Client(base_url=base_url, auth=(FLOWER_USER, password), timeout=10.0, trust_env=False)
        self.bodies: list[str] = []

    def get(self, path: str, **params: Any) -> httpx.Response:
        response = self.client.get(path, params=params)
        self.bodies.append(response.text)
        return response

    def json(self, path: str, **params: Any) -> Any:
        response = self.get(path, **params)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text[:200]}"
        return response.json()

    def send_tasks(self) -> dict[str, dict[str, Any]]:
        return self.json("/api/tasks", taskname=SEND_TASK, limit=1000)

    def close(self) -> None:
        self.client.close()


def _flower_answers(base_url: str, group: ProcessGroup) -> bool:
    flower = group.processes["flower"]
    if flower.poll() is not None:
        raise AssertionError(f"Flower exited with {flower.returncode} while starting:\n{group.logs()[-3000:]}")
    try:
        return httpx.get(f"{base_url}/healthcheck", timeout=1.0, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_flower_shows_the_sends_with_ids_only(
    sandbox: SandboxProcess, fresh_postgres_url: str, redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    # Given a worker, and Flower started with `dispatcher flower` on a loopback port with basic auth
    sandbox.reset()
    broker_url = fresh_broker_url(redis_url)
    upgrade_database(fresh_postgres_url)
    password = secrets.token_urlsafe(18)
    env = dispatcher_environment(api_url=sandbox.base_url, database_url=fresh_postgres_url, broker_url=broker_url)
    env = {key: value for key, value in env.items() if not key.startswith("FLOWER_")}
    env["FLOWER_BASIC_AUTH"] = f"{FLOWER_USER}:{password}"
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    api = FlowerApi(base_url, password)
    enqueuer = CeleryEnqueuer(broker_url)
    try:
        with process_group(env, tmp_path) as group:
            _run_flower_scenario(group, api, enqueuer, env, fresh_postgres_url, port, password, sandbox)
    finally:
        api.close()
        enqueuer.close()


def _run_flower_scenario(
    group: ProcessGroup, api: FlowerApi, enqueuer: CeleryEnqueuer, env: dict[str, str], database_url: str,
    port: int, password: str, sandbox: SandboxProcess,
) -> None:
    base_url = f"http://127.0.0.1:{port}"
    group.start_worker("w1")
    group.start("flower", ["-m", "dispatcher", "flower", "--port", str(port), "--address", "127.0.0.1"])
    wait_until(lambda: _flower_answers(base_url, group), timeout_s=30, what="Flower to answer")
    # Flower's event receiver has seen the worker (heartbeats) before anything is sent
    wait_until(lambda: any(name.startswith("w1@") and alive for name, alive in api.json("/api/workers", status="true").items()),
               timeout_s=30, what="Flower to see the worker w1 online")

    # When three reminders are handed over and sent
    dispatcher = Dispatcher(_settings_from(env), enqueuer=enqueuer)
    events = [f"flower-{n}" for n in range(3)]
    for n, event_id in enumerate(events):
        dispatcher.notify(reminder(event_id, identifier=f"flower-patient-{n}", phone=_phone(n)))
    wait_until(lambda: all(dispatcher.status(event_id).message_id is not None for event_id in events),
               timeout_s=60, what="the three notifications to be sent")
    ids = _notification_ids(database_url, events)
    assert set(ids) == set(events)

    def succeeded_ids() -> set[int]:
        return {next(iter(_args_ids(task.get("args")))) for task in api.send_tasks().values() if task.get("state") == "SUCCESS"}

    wait_until(lambda: set(ids.values()) <= succeeded_ids(), timeout_s=30, what="Flower to show the sends as SUCCESS")

    # Then every send task Flower knows is dispatcher.send with one of our IDs as its only argument
    tasks = api.send_tasks()
    assert tasks
    for task in tasks.values():
        assert task["name"] == SEND_TASK
        assert _args_ids(task["args"]) <= set(ids.values())
        assert task["kwargs"] in ("{}", None)
        assert task["worker"].startswith("w1@")
    # And each notification's send shows as `(notification=<id>)` when it was first published
    shown = {task["args"] for task in tasks.values()}
    for notification_id in ids.values():
        assert f"(notification={notification_id})" in shown
    # And the task's own page in the API says the same
    for task_id, task in tasks.items():
        if task["state"] != "SUCCESS":
            continue
        info = api.json(f"/api/task/info/{task_id}")
        assert info["name"] == SEND_TASK and info["state"] == "SUCCESS"
        assert info["args"] == task["args"]
        assert info["worker"].startswith("w1@")
    # And the worker list and the task types read well
    assert SEND_TASK in api.json("/api/task/types")["task-types"]
    workers = api.json("/api/workers", refresh="true")
    w1 = next(name for name in workers if name.startswith("w1@"))
    assert SEND_TASK in workers[w1].get("registered", [])
    for task_id in list(tasks)[:2]:  # the UI's task page renders from the same state
        page = api.get(f"/task/{task_id}")
        assert page.status_code == 200

    # And the API needs the credentials
    assert httpx.get(f"{base_url}/api/tasks", timeout=5.0, trust_env=False).status_code == 401
    assert httpx.get(f"{base_url}/api/tasks", auth=(FLOWER_USER, "wrong"), timeout=5.0, trust_env=False).status_code == 401
    # And Flower is read-only: it cannot publish a send or revoke one
    some_id = next(iter(ids.values()))
    refused = api.client.post(f"/api/task/async-apply/{SEND_TASK}", json={"args": [some_id]})
    assert refused.status_code == 403
    assert api.client.post(f"/api/task/revoke/{next(iter(tasks))}").status_code == 403
    assert sandbox.stats()["calls"].get("createMessage") == len(events)

    # And nothing private appears in anything Flower answered, nor any credential in the logs
    answered = "\n".join(api.bodies)
    assert "dispatcher.send" in answered
    private = [re.compile(r"\+?1555042\d{4}"), re.compile(r"Reminder flower-"), re.compile(re.escape(DEFAULT_TOKEN)),
               re.compile("Test Patient"), re.compile("flower-patient-"), re.compile("tomorrow 09:00")]
    for pattern in private:
        assert not pattern.search(answered), f"Flower's API shows private data: {pattern.pattern!r}"
    logs = group.logs()
    assert "Visit me at http://127.0.0.1" in logs, "Flower's log was not captured"
    assert password not in logs
    for pattern in private:
        assert not pattern.search(logs), f"private data in process output: {pattern.pattern!r}"
