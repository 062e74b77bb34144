"""The command line: every command listed, bad configuration named by key, no secret printed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dispatcher.cli.main import cli
from tests.conftest import REPO_ROOT

EXAMPLE = str(REPO_ROOT / "config" / "dispatcher.example.toml")


@pytest.fixture()
def runner(clean_environment: pytest.MonkeyPatch) -> CliRunner:
    return CliRunner()


def test_help_lists_the_commands(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["--help"])
    assert result.exit_code == 0
    for command in ("demo", "sandbox", "config", "inboxes"):
        assert f"  {command}" in result.output


@pytest.mark.parametrize("command", [["demo"], ["sandbox"], ["config", "check"], ["inboxes"]])
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
    assert result.exit_code == 2
    assert "DISPATCHER_ACCOUNT_ID" in result.output
    assert "Traceback" not in result.output


def test_a_missing_token_fails_naming_the_key(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["config", "check"], env={"DISPATCHER_API_URL": "http://x", "DISPATCHER_ACCOUNT_ID": "1"})
    assert result.exit_code == 2
    assert "DISPATCHER_API_TOKEN" in result.output
