"""Several workspaces with real parts: one worker process sends for the default workspace (the
sandbox's account 1) and for two more accounts of the same sandbox process (Redis broker,
PostgreSQL store). Each message goes to its notification's account and inbox, and a workspace
whose token is refused waits, saying why, while the others go on: the circuit breaker is per
workspace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.service import Dispatcher
from dispatcher.store.migrate import upgrade_database
from tests.integration.send.test_workers import _settings_from
from tests.support.dispatcher_setup import reminder
from tests.support.sandbox_process import running_sandbox
from tests.support.worker_process import dispatcher_environment, fresh_broker_url, process_group, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Account 2 of the sandbox's seed has one inbox: 6, an API channel.
PORTAL = {"portal": {"inbox_id": 6, "channel": "other"}}


def test_each_workspace_gets_its_own_messages_and_pauses_alone(
        fresh_postgres_url: str, redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    with running_sandbox() as sandbox:
        upgrade_database(fresh_postgres_url)
        broker_url = fresh_broker_url(redis_url)
        workspaces = {
            "north": {"api_url": sandbox.base_url, "account_id": 2, "api_token": "sandbox-token-account-2",
                      "routes": PORTAL},
            "broken": {"api_url": sandbox.base_url, "account_id": 3, "api_token": "not-the-sandbox-token",
                       "routes": PORTAL},
        }
        env = dispatcher_environment(api_url=sandbox.base_url, database_url=fresh_postgres_url, broker_url=broker_url,
                                     DISPATCHER_WORKSPACES=json.dumps(workspaces))
        settings = _settings_from({key: value for key, value in env.items() if key != "DISPATCHER_WORKSPACES"},
                                  workspaces=workspaces)
        host = Dispatcher(settings, enqueuer=CeleryEnqueuer(broker_url))
        default_events = [f"ws-default-{n}" for n in range(3)]
        north_events = [f"ws-north-{n}" for n in range(3)]
        with process_group(env, tmp_path) as group:
            group.start_worker("w1")
            group.start_beat()
            for number, event_id in enumerate(default_events):
                host.notify(reminder(event_id, identifier=f"{event_id}-p", phone=f"+1555041{number:04d}"))
            for number, event_id in enumerate(north_events):
                host.notify({**reminder(event_id, identifier=f"{event_id}-p", phone=f"+1555042{number:04d}",
                                        route="portal"), "workspace": "north"})
            host.notify({**reminder("ws-broken-0", identifier="b-p", phone="+15550429999", route="portal"),
                         "workspace": "broken"})
            every = [*default_events, *north_events]
            wait_until(lambda: all(host.status(e).message_id is not None for e in every)
                       and host.status("ws-broken-0").error_kind == "auth", timeout_s=120,
                       what="both workspaces' messages sent, and the broken one waiting")
            broken = host.status("ws-broken-0")
            assert broken.state in ("queued", "sending") and broken.message_id is None
        per_event = sandbox.messages_per_event()
        assert {event: per_event[event] for event in every} == {event: 1 for event in every}
        where = {(m.get("content") or "").split(":")[0].removeprefix("Reminder "): (m["account_id"], m["inbox_id"])
                 for m in sandbox.messages()}
        assert {where[e] for e in default_events} == {(1, 1)} and {where[e] for e in north_events} == {(2, 6)}
