"""The command line as an operator scripts it: exit statuses by kind, one line per error and never a
traceback, filters that are checked, tables with headers and times, ``--json`` on the commands that
read, paging, and no request value (a phone number, a content) in any error."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from dispatcher import service
from dispatcher.operations.cli import exits
from dispatcher.operations.cli.main import cli
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import reminder

EXAMPLE = str(REPO_ROOT / "config" / "dispatcher.example.toml")
PHONE = "+15550187766"


@pytest.fixture()
def env(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> dict[str, str]:
    clean_environment.setattr(service, "_default", None)  # each test's own default dispatcher
    return {"DISPATCHER_CONFIG": EXAMPLE, "DISPATCHER_DATABASE_URL": f"sqlite:///{tmp_path}/cli.sqlite",
            "DISPATCHER_BROKER_URL": f"filesystem://{tmp_path}/broker"}


def run(arguments: list[str], env: dict[str, str], **options: Any) -> Result:
    service._default = None  # each command reads its environment afresh, as a new process would
    return CliRunner().invoke(cli, arguments, env=env, **options)


def hand_over(env: dict[str, str], tmp_path: Path, event_id: str, **changes: Any) -> None:
    request = tmp_path / f"{event_id}.json"
    request.write_text(json.dumps({**reminder(event_id, identifier=f"p-{event_id}", phone=PHONE), **changes}))
    assert run(["notify", "--file", str(request)], env).exit_code == exits.OK


def one_error_line(result: Result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_the_help_lists_the_exit_statuses(env: dict[str, str]) -> None:
    result = run(["--help"], env)
    assert "Exit statuses:" in result.output
    assert all(f"  {status}  " in result.output for status in (exits.OK, exits.FAILED, exits.USAGE,
                                                                 exits.CONFIGURATION, exits.UNREACHABLE))


def test_a_state_that_is_not_one_is_a_usage_error_listing_the_states(env: dict[str, str]) -> None:
    result = run(["list", "--state", "bogus"], env)
    assert result.exit_code == exits.USAGE
    assert "'bogus' is not one of" in result.output and "'falling_back'" in result.output


def test_each_kind_of_failure_has_its_status_and_one_line(env: dict[str, str], tmp_path: Path) -> None:
    assert run(["db", "upgrade"], env).exit_code == exits.OK
    missing = run(["status", "no-such-event"], env)
    assert missing.exit_code == exits.FAILED and one_error_line(missing).startswith("error: no notification")
    unsupported = run(["list"], {**env, "DISPATCHER_DATABASE_URL": "mysql://app@127.0.0.1/dispatcher"})
    assert unsupported.exit_code == exits.CONFIGURATION
    assert one_error_line(unsupported).startswith("error: DISPATCHER_DATABASE_URL (database_url): must be")
    bad_setting = run(["beat"], {**env, "DISPATCHER_SWEEP_INTERVAL_S": "-1"})
    assert bad_setting.exit_code == exits.CONFIGURATION
    assert one_error_line(bad_setting).startswith("error: DISPATCHER_SWEEP_INTERVAL_S")
    unreachable = run(["list"], {**env, "DISPATCHER_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere"})
    assert unreachable.exit_code == exits.UNREACHABLE
    assert one_error_line(unreachable).startswith("error: the database failed the command (OperationalError)")


def test_a_key_the_host_chose_never_reaches_an_error(env: dict[str, str], tmp_path: Path) -> None:
    request = reminder("evt-key", identifier="p-key", phone="+15550187700")
    request["contact"][PHONE] = "x"  # a phone number as an unknown key
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(request))
    result = run(["notify", "--file", str(path)], env)
    assert result.exit_code == exits.USAGE
    assert one_error_line(result) == "error: contact.*: Extra inputs are not permitted"
    assert PHONE.removeprefix("+") not in result.output


def test_list_filters_pages_and_prints_json(env: dict[str, str], tmp_path: Path) -> None:
    for number in range(5):
        hand_over(env, tmp_path, f"evt-list-{number}", route="sms" if number % 2 else "reminders")
    table = run(["list"], env)
    assert table.exit_code == exits.OK
    header, *rows = table.output.strip().splitlines()
    assert header.split()[:5] == ["event", "workspace", "state", "route", "channel"]
    assert "created (UTC)" in header and "updated (UTC)" in header
    assert [row.split()[0] for row in rows] == [f"evt-list-{number}" for number in (4, 3, 2, 1, 0)]
    only_sms = run(["list", "--route", "sms", "--json"], env)
    listed = [json.loads(line) for line in only_sms.output.strip().splitlines()]
    assert [row["event_id"] for row in listed] == ["evt-list-3", "evt-list-1"]
    assert {row["state"] for row in listed} == {"queued"} and set(listed[0]) >= {"created_at", "updated_at", "cursor"}
    assert PHONE not in only_sms.output and "Reminder" not in only_sms.output
    first = run(["list", "--limit", "2"], env)
    cursor = first.output.strip().splitlines()[-1]
    assert cursor.startswith("next page: --before ")
    second = run(["list", "--limit", "2", "--before", cursor.split()[-1], "--json"], env)
    assert [json.loads(line)["event_id"] for line in second.output.strip().splitlines()] == ["evt-list-2", "evt-list-1"]
    assert run(["list", "--since", "2999-01-01"], env).output.strip() == "no notifications"


def test_the_commands_that_read_answer_json(env: dict[str, str]) -> None:
    checked = json.loads(run(["config", "check", "--json"], env).output)
    assert checked["ok"] is True and checked["routes"]["reminders"]["fallback"] == "sms"
    assert "sandbox-token-account-1" not in json.dumps(checked)
    assert run(["db", "upgrade"], env).exit_code == exits.OK
    assert run(["deliveries", "list", "--json"], env).output == ""

    def workspace(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/inboxes"):
            return httpx.Response(200, json={"payload": [
                {"id": 1, "name": "WhatsApp Reminders", "channel_type": "Channel::Whatsapp"},
                {"id": 2, "name": "SMS", "channel_type": "Channel::Sms"}]})
        return httpx.Response(200, json={"payload": [
            {"id": 5, "url": "https://hooks.example/w", "subscriptions": ["message_created", "message_updated"]}]})

    transport = {"transport": httpx.MockTransport(workspace)}
    inboxes = run(["inboxes", "--json"], env, obj=transport)
    answer = json.loads(inboxes.output)
    assert answer["routes"]["sms"] == 2 and answer["routes"]["email"] is None  # the example's e-mail inbox is missing
    assert inboxes.exit_code == exits.FAILED  # a route that matches no inbox
    hooks = run(["webhooks", "list", "--json"], env, obj=transport)
    assert hooks.exit_code == exits.OK
    assert json.loads(hooks.output) == {"id": 5, "url": "https://hooks.example/w",
                                        "subscriptions": ["message_created", "message_updated"]}


def test_an_unreachable_workspace_is_status_4_and_a_refused_token_status_3(env: dict[str, str]) -> None:
    down = httpx.MockTransport(lambda request: (_ for _ in ()).throw(httpx.ConnectError("refused")))
    unreachable = run(["inboxes"], env, obj={"transport": down})
    assert unreachable.exit_code == exits.UNREACHABLE and "workspace API failed" in one_error_line(unreachable)
    refused = httpx.MockTransport(lambda request: httpx.Response(401, json={"error": "Invalid Access Token"}))
    token = run(["inboxes"], env, obj={"transport": refused})
    assert token.exit_code == exits.CONFIGURATION and "DISPATCHER_API_TOKEN" in one_error_line(token)


def test_a_missing_embedded_store_is_a_wrong_path_not_a_new_empty_one(env: dict[str, str], tmp_path: Path) -> None:
    missing = {**env, "DISPATCHER_DATABASE_URL": f"sqlite:///{tmp_path}/nowhere/cli.sqlite"}
    for command in (["status", "evt-1"], ["list"], ["cancel", "evt-1"]):
        result = run(command, missing)
        assert result.exit_code == exits.CONFIGURATION
        assert one_error_line(result).startswith("error: DISPATCHER_DATABASE_URL (database_url): names a SQLite file")
    assert not (tmp_path / "nowhere").exists()
    assert run(["db", "upgrade"], env).exit_code == exits.OK
    assert run(["list", "--since", "24h"], env).exit_code == exits.OK  # hours back, as the dashboard takes them
    huge = run(["list", "--before", "99999999999999999999"], env)
    assert huge.exit_code == exits.USAGE and "Traceback" not in huge.output
    ancient = run(["list", "--since", "0001-01-01T00:00:00+05:00"], env)
    assert ancient.exit_code == exits.USAGE and "an ISO time" in ancient.output


def test_tracing_asked_for_without_its_packages_is_a_configuration_mistake(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if the tracing extra were missing
    traced = {**env, "DISPATCHER_OTLP_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}
    for command in (["config", "check"], ["beat"]):
        result = run(command, traced)
        assert result.exit_code == exits.CONFIGURATION
        assert one_error_line(result).startswith("error: DISPATCHER_OTLP_ENDPOINT (otlp_endpoint): needs the tracing")


def test_notify_priority_sets_the_lane_and_a_wrong_one_is_the_operators_typo(env: dict[str, str], tmp_path: Path) -> None:
    request = tmp_path / "code.json"
    request.write_text(json.dumps(reminder("cli-urgent", identifier="p-1", phone=PHONE)))
    assert run(["notify", "--file", str(request), "--priority", "urgent"], env).exit_code == exits.OK
    shown = run(["status", "cli-urgent", "--json"], env)
    assert json.loads(shown.output)["priority"] == "urgent"
    refused = run(["notify", "--priority", "asap", "--file", "-"], env, input=request.read_text())
    assert refused.exit_code == 2 and "asap" in refused.output  # click names the operator's own typo


def test_a_receiver_whose_port_is_taken_says_so_in_one_line(env: dict[str, str]) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        for workers in ("1", "2"):
            result = run(["receiver", "--port", str(port), "--workers", workers], env)
            assert result.exit_code == exits.USAGE
            assert f"cannot listen on http://127.0.0.1:{port}" in result.output and "Traceback" not in result.output
    finally:
        taken.close()
