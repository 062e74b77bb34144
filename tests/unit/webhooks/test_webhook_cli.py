"""``dispatcher receiver`` and ``dispatcher webhooks register``, without servers."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
import uvicorn
from click.testing import CliRunner

from dispatcher.errors import ConfigurationError
from dispatcher.operations.cli.webhook_commands import receiver_command, receiver_log_config, webhooks_group

ENV = {"DISPATCHER_API_URL": "https://workspace.example", "DISPATCHER_ACCOUNT_ID": "7",
       "DISPATCHER_API_TOKEN": "cli-token-abc123"}
NEW_SECRET = "whsec-from-the-workspace-77"


@pytest.fixture()
def runner(clean_environment: pytest.MonkeyPatch) -> CliRunner:
    return CliRunner()


@pytest.mark.parametrize(("command", "arguments"), [
    (receiver_command, ["--help"]), (webhooks_group, ["--help"]), (webhooks_group, ["register", "--help"]),
])
def test_help_has_an_example(runner: CliRunner, command: object, arguments: list[str]) -> None:
    result = runner.invoke(command, arguments)  # type: ignore[arg-type]
    assert result.exit_code == 0
    assert "Example" in result.output


def test_register_subscribes_both_message_events_and_prints_the_secret_once(
    runner: CliRunner, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[httpx.Request] = []

    def workspace(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        webhook = {"id": 12, "name": "dispatcher", "url": "https://hooks.example/w", "account_id": 7,
                   "subscriptions": ["message_created", "message_updated"], "secret": NEW_SECRET}
        return httpx.Response(200, json={"payload": {"webhook": webhook}})

    with caplog.at_level(logging.DEBUG):
        result = runner.invoke(webhooks_group, ["register", "--url", "https://hooks.example/w", "--name", "dispatcher"],
                               env=ENV, obj={"transport": httpx.MockTransport(workspace)})
    assert result.exit_code == 0, result.output
    [request] = seen
    assert (request.method, request.url.path) == ("POST", "/api/v1/accounts/7/webhooks")
    assert json.loads(request.content) == {"webhook": {"url": "https://hooks.example/w", "name": "dispatcher",
                                                       "subscriptions": ["message_created", "message_updated"]}}
    assert result.output.count(NEW_SECRET) == 1
    assert result.output.splitlines()[-1] == NEW_SECRET
    assert "DISPATCHER_WEBHOOK_SECRETS" in result.output
    assert NEW_SECRET not in caplog.text and "cli-token-abc123" not in caplog.text


def test_register_without_a_secret_in_the_answer_fails(runner: CliRunner) -> None:
    answer = httpx.MockTransport(lambda request: httpx.Response(200, json={"payload": {"webhook": {"id": 3}}}))
    result = runner.invoke(webhooks_group, ["register", "--url", "https://hooks.example/w"], env=ENV,
                           obj={"transport": answer})
    assert result.exit_code == 1
    assert "no signing secret" in result.output


def test_register_with_bad_settings_names_the_key(runner: CliRunner) -> None:
    result = runner.invoke(webhooks_group, ["register", "--url", "https://x"], env={**ENV, "DISPATCHER_ACCOUNT_ID": "x"})
    assert isinstance(result.exception, ConfigurationError)
    assert "DISPATCHER_ACCOUNT_ID" in str(result.exception)


def test_receiver_checks_the_settings_before_starting_a_server(runner: CliRunner) -> None:
    result = runner.invoke(receiver_command, ["--port", "1"], env={**ENV, "DISPATCHER_WEBHOOK_HEADER_PREFIX": "no way"})
    assert isinstance(result.exception, ConfigurationError)
    assert "DISPATCHER_WEBHOOK_HEADER_PREFIX" in str(result.exception)


def test_receiver_logging_keeps_dispatcher_warnings() -> None:
    config = receiver_log_config()
    assert config["loggers"]["dispatcher"]["level"] == "WARNING"
    assert config["loggers"]["dispatcher"]["handlers"] == ["default"]


def test_receiver_says_where_it_listens_before_it_serves(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatcher.operations.cli import webhook_commands

    served: list[uvicorn.Config] = []
    monkeypatch.setattr(webhook_commands, "serve", lambda config: served.append(config) or True)
    result = runner.invoke(receiver_command, ["--host", "127.0.0.1", "--port", "8089"],
                           env={**ENV, "DISPATCHER_INTAKE_TOKEN": "intake-token-0123456789abcdef"})
    assert result.exit_code == 0, result.output
    assert result.output.startswith("receiver listening on http://127.0.0.1:8089: webhooks at /webhooks/messaging")
    assert "HTTP intake at /v1/notifications" in result.output and "intake-token" not in result.output
    assert served and (served[0].host, served[0].port, served[0].workers) == ("127.0.0.1", 8089, 1)
