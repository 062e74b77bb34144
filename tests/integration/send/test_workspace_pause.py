"""A workspace that refuses our token, or does not answer: every worker waits, says why, and goes on by itself.

Real processes: two send workers and beat over Redis and PostgreSQL, and the stock sandbox. The
breaker's pauses are shortened (1 s, doubling to 3 s; the shipped defaults are 5 s and 120 s) so
that the test waits seconds, not minutes, for the probe that lets everyone go on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.service import Dispatcher
from dispatcher.store.migrate import upgrade_database
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.sandbox_process import free_port, running_sandbox
from tests.support.worker_process import ProcessGroup, dispatcher_environment, fresh_broker_url, process_group, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

WRONG_TOKEN = "a-token-this-workspace-never-issued"
SHORT_PAUSES = {"DISPATCHER_BREAKER_BASE_S": "1", "DISPATCHER_BREAKER_CAP_S": "3"}
# The seed again, but the workspace now also knows the token the workers hold (an operator fixed it).
TOKEN_FIXED = f"""
accounts = [{{ id = 1, name = "Demo Clinic" }}]
tokens = [{{ token = "sandbox-token-account-1", accounts = [1] }}, {{ token = "{WRONG_TOKEN}", accounts = [1] }}]
inboxes = [
  {{ id = 1, account_id = 1, name = "WhatsApp Reminders", channel_type = "Channel::Whatsapp", templates = [
    {{ name = "appointment_reminder", language = "en", category = "UTILITY", body_params = 2 }} ] }},
  {{ id = 2, account_id = 1, name = "SMS", channel_type = "Channel::Sms" }},
]
"""


def _dispatcher(env: dict[str, str]) -> Dispatcher:
    overrides: dict[str, Any] = {key.removeprefix("DISPATCHER_").lower(): value for key, value in env.items()
                                 if key.startswith("DISPATCHER_") and key != "DISPATCHER_CONFIG"
                                 and not key.startswith("DISPATCHER_TEST_")}
    return Dispatcher(example_settings(**overrides), enqueuer=CeleryEnqueuer(env["DISPATCHER_BROKER_URL"]))


@pytest.fixture()
def stack(fresh_postgres_url: str, redis_url: str, tmp_path: Path,
          clean_environment: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, str], Path]]:
    upgrade_database(fresh_postgres_url)
    port = free_port()
    env = dispatcher_environment(api_url=f"http://127.0.0.1:{port}", database_url=fresh_postgres_url,
                                 broker_url=fresh_broker_url(redis_url), **SHORT_PAUSES)
    yield env, tmp_path


def _start_workers(env: dict[str, str], tmp_path: Path) -> Any:
    context = process_group(env, tmp_path / "logs")
    group: ProcessGroup = context.__enter__()
    group.start_worker("w1")
    group.start_worker("w2")
    group.start_beat()
    return context, group


def _waiting_with(dispatcher: Dispatcher, events: list[str], kind: str) -> bool:
    records = [dispatcher.status(event) for event in events]
    return all(r.state == "queued" and r.error_kind == kind and r.error_detail for r in records)


def _all_sent(dispatcher: Dispatcher, events: list[str]) -> bool:
    return all(dispatcher.status(event).message_id is not None for event in events)


def test_a_refused_token_pauses_every_worker_shows_why_and_resumes_when_it_is_fixed(
    stack: tuple[dict[str, str], Path],
) -> None:
    env, tmp_path = stack
    env["DISPATCHER_API_TOKEN"] = WRONG_TOKEN
    port = int(env["DISPATCHER_API_URL"].rsplit(":", 1)[1])
    state = tmp_path / "sandbox-state.jsonl"
    (tmp_path / "logs").mkdir()
    events = [f"pause-auth-{n}" for n in range(5)]
    with running_sandbox(state_file=state, port=port) as refusing:
        context, group = _start_workers(env, tmp_path)
        try:
            dispatcher = _dispatcher(env)
            for n, event in enumerate(events):
                dispatcher.notify(reminder(event, identifier=f"pause-p{n}", phone=f"+155503410{n:02d}"))
            # Then within a minute every notification waits, queued, saying why
            wait_until(lambda: _waiting_with(dispatcher, events, "auth"), timeout_s=60, what="the reason on every notification")
            record = dispatcher.status(events[0])
            assert "DISPATCHER_API_TOKEN" in (record.error_detail or "") and WRONG_TOKEN not in (record.error_detail or "")
            listed = subprocess.run([sys.executable, "-m", "dispatcher", "list", "--state", "queued", "--json"], env=env,
                                    capture_output=True, text=True, timeout=60, check=True).stdout
            assert sum(json.loads(line)["error_kind"] == "auth" for line in listed.splitlines()) == len(events)
            # and the workers do not storm the workspace: a probe every few seconds at most
            before = sum(refusing.stats()["calls"].values())
            time.sleep(6.0)  # a window to count calls in, not a timing under test
            during = sum(refusing.stats()["calls"].values()) - before
            assert during <= 8, f"{during} calls in 6 s while paused"
            assert all(dispatcher.status(event).message_id is None for event in events)
        except BaseException:
            context.__exit__(None, None, None)
            raise
    # When the workspace accepts the token again (restarted, keeping its data)
    try:
        with running_sandbox(TOKEN_FIXED, state_file=state, port=port) as fixed:
            # Then the workers go on by themselves, and each notification is sent once
            wait_until(lambda: _all_sent(dispatcher, events), timeout_s=60, what="sends after the token was fixed")
            assert len(fixed.messages()) == len(events)
            assert all(dispatcher.status(event).error_kind is None for event in events)
        logs = group.logs()
    finally:
        context.__exit__(None, None, None)
    assert logs.count("workspace paused for every worker: auth") == 1  # one line per pause, not per notification
    assert logs.count("workspace answers again") == 1
    assert WRONG_TOKEN not in logs


def test_an_unreachable_workspace_pauses_and_resumes_when_it_answers(stack: tuple[dict[str, str], Path]) -> None:
    env, tmp_path = stack
    port = int(env["DISPATCHER_API_URL"].rsplit(":", 1)[1])
    (tmp_path / "logs").mkdir()
    events = [f"pause-down-{n}" for n in range(3)]
    context, group = _start_workers(env, tmp_path)
    try:
        dispatcher = _dispatcher(env)
        for n, event in enumerate(events):
            dispatcher.notify(reminder(event, identifier=f"down-p{n}", phone=f"+155503420{n:02d}"))
        wait_until(lambda: _waiting_with(dispatcher, events, "unreachable"), timeout_s=60,
                   what="the reason on every notification")
        assert "DISPATCHER_API_URL" in (dispatcher.status(events[0]).error_detail or "")
        with running_sandbox(port=port) as answering:
            wait_until(lambda: _all_sent(dispatcher, events), timeout_s=60, what="sends once the workspace answers")
            assert len(answering.messages()) == len(events)
    finally:
        context.__exit__(None, None, None)
    assert group.logs().count("workspace paused for every worker: unreachable") == 1

