"""The command line: every command listed, bad configuration named by key, no secret printed."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dispatcher.operations.cli.main import cli
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import reminder

EXAMPLE = str(REPO_ROOT / "config" / "dispatcher.example.toml")


@pytest.fixture()
def runner(clean_environment: pytest.MonkeyPatch) -> CliRunner:
    return CliRunner()


ISSUE_COMMANDS = ("demo", "sandbox", "worker", "consumer", "receiver", "beat", "flower", "notify", "status", "list",
                  "webhooks", "db")


def _leaf_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[list[str]]:
    leaves = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            leaves += _leaf_commands(command, (*prefix, name))
        else:
            leaves.append([*prefix, name])
    return leaves


def test_help_lists_the_commands(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["--help"])
    assert result.exit_code == 0
    for command in (*ISSUE_COMMANDS, "config", "inboxes"):
        assert f"  {command}" in result.output, command
    assert ["webhooks", "register"] in _leaf_commands(cli) and ["db", "upgrade"] in _leaf_commands(cli)


@pytest.mark.parametrize("command", _leaf_commands(cli), ids=" ".join)
def test_every_command_has_help_with_an_example(runner: CliRunner, command: list[str]) -> None:
    result = runner.invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output


def test_config_check_summarises_without_the_token(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["config", "check"], env={"DISPATCHER_CONFIG": EXAMPLE})
    assert result.exit_code == 0, result.output
    assert "configuration OK" in result.output
    assert "reminders: messaging_platform through inbox named 'WhatsApp Reminders', falls back to sms" in result.output
    assert "sandbox-token-account-1" not in result.output


def test_a_bad_value_fails_naming_the_key(runner: CliRunner) -> None:
    result = runner.invoke(
        cli, ["config", "check"], env={"DISPATCHER_CONFIG": EXAMPLE, "DISPATCHER_ACCOUNT_ID": "abc"}
    )
    assert result.exit_code == 3
    assert "DISPATCHER_ACCOUNT_ID" in result.output
    assert "Traceback" not in result.output


def test_a_missing_token_fails_naming_the_key(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["config", "check"], env={"DISPATCHER_API_URL": "http://x", "DISPATCHER_ACCOUNT_ID": "1"})
    assert result.exit_code == 3
    assert "DISPATCHER_API_TOKEN" in result.output


def test_config_check_never_prints_a_password_in_a_url(runner: CliRunner) -> None:
    env = {"DISPATCHER_CONFIG": EXAMPLE,
           "DISPATCHER_DATABASE_URL": "postgresql+psycopg://app:db-pass-s3cret@127.0.0.1:5432/dispatcher",
           "DISPATCHER_BROKER_URL": "redis://:broker-pass-s3cret@127.0.0.1:6379/0",
           "DISPATCHER_API_URL": "http://user:api-pass-s3cret@127.0.0.1:3000"}
    result = runner.invoke(cli, ["config", "check"], env=env)
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output
    assert "database_url: postgresql+psycopg://app:***@127.0.0.1:5432/dispatcher" in result.output
    assert "broker_url: redis://:***@127.0.0.1:6379/0" in result.output


def test_a_database_that_fails_ends_notify_with_one_line_and_status_4(runner: CliRunner, tmp_path: Path) -> None:
    request = tmp_path / "reminder.json"
    content = "Reminder: your HIV test result is ready"
    request.write_text(json.dumps(reminder("cli-db-down", identifier="p-1", phone="+15550199998", content=content)))
    env = {"DISPATCHER_CONFIG": EXAMPLE, "DISPATCHER_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"}
    result = runner.invoke(cli, ["notify", "--file", str(request)], env=env)
    assert result.exit_code == 4, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the database failed the command (OperationalError)")
    assert "HIV" not in result.output and "+15550199998" not in result.output
