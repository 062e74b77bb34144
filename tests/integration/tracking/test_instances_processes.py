"""Workspaces on separate instances, with every part real: two sandbox processes, each an instance
whose account 1 numbers its contacts, conversations and messages from 1, so the two workspaces'
messages bear the same IDs. Each instance delivers its (stock, status-less) webhooks to its own
path of one receiver; consumers read each message back through its own workspace's API. Every
notification ends read, in its own instance, once; an opt-out in one workspace does not stop the
other's message to the same person, and a webhook of one workspace is never applied to the other's
message of the same ID."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatcher.api import WorkspaceClient
from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.service import Dispatcher
from dispatcher.store.migrate import upgrade_database
from tests.integration.send.test_workers import _settings_from
from tests.support.dispatcher_setup import reminder
from tests.support.ports import listens
from tests.support.sandbox_process import free_port, running_sandbox
from tests.support.worker_process import dispatcher_environment, fresh_broker_url, process_group, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

QUICK_OUTCOMES = """
[behaviour]
delivered_after_s = 0.2
read_after_s = 0.3
"""
SUBSCRIPTIONS = ["message_created", "message_updated"]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_two_instances_numbering_alike_each_track_their_own_messages(
        fresh_postgres_url: str, redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    with running_sandbox(QUICK_OUTCOMES) as north_instance, running_sandbox(QUICK_OUTCOMES) as south_instance:
        upgrade_database(fresh_postgres_url)
        broker_url, receiver_port = fresh_broker_url(redis_url), free_port()
        receiver = f"http://127.0.0.1:{receiver_port}"
        env = dispatcher_environment(api_url=north_instance.base_url, database_url=fresh_postgres_url,
                                     broker_url=broker_url)
        south: dict[str, Any] = {"api_url": south_instance.base_url, "account_id": 1,
                                 "api_token": "sandbox-token-account-1"}
        settings = _settings_from(env, workspaces={"south": south})
        # Each instance is told where its webhooks go, and gives its own secret.
        with WorkspaceClient.from_settings(settings) as client:
            north_secret = client.create_webhook(url=f"{receiver}{settings.webhook_path}",
                                                 subscriptions=SUBSCRIPTIONS).secret
        with WorkspaceClient.from_settings(settings.for_workspace("south")) as client:
            south_secret = client.create_webhook(url=f"{receiver}{settings.webhook_path}/south",
                                                 subscriptions=SUBSCRIPTIONS).secret
        assert north_secret is not None and south_secret is not None
        south["webhook_secrets"] = [south_secret.get_secret_value()]
        env.update(DISPATCHER_WEBHOOK_SECRETS=north_secret.get_secret_value(), DISPATCHER_WORKSPACES=json.dumps({"south": south}))
        settings = _settings_from({key: value for key, value in env.items() if key != "DISPATCHER_WORKSPACES"},
                                  workspaces={"south": south})
        host = Dispatcher(settings, enqueuer=CeleryEnqueuer(broker_url))
        # The same three people in both workspaces; the first opted out of the north one only.
        people = [(f"person-{number}", f"+1555061{number:04d}") for number in range(3)]
        host.recipients_for("default").suppress({"identifier": people[0][0]})
        north_events = [f"north-{number}" for number in range(3)]
        south_events = [f"south-{number}" for number in range(3)]
        with process_group(env, tmp_path) as group:
            started = group.start("receiver", ["-m", "dispatcher", "receiver", "--host", "127.0.0.1", "--port",
                                               str(receiver_port)])
            group.start_worker("sender", concurrency=2)
            group.start_worker("consumer", concurrency=2, queues="dispatcher.outcomes")
            group.start_beat()
            wait_until(lambda: _answers(f"{receiver}/healthz") and listens(started.pid, receiver_port), timeout_s=30,
                       what="the receiver")
            for event_id, (identifier, phone) in zip(north_events, people, strict=True):
                host.notify(reminder(event_id, identifier=identifier, phone=phone))
            for event_id, (identifier, phone) in zip(south_events, people, strict=True):
                host.notify({**reminder(event_id, identifier=identifier, phone=phone), "workspace": "south"})
            tracked = [*north_events[1:], *south_events]
            wait_until(lambda: all(host.status(event_id).state == "read" for event_id in tracked)
                       and host.status(north_events[0]).error_kind == "opted_out", timeout_s=150,
                       what="every message read in its own instance, the opted-out one refused")
        north_sent, south_sent = north_instance.messages_per_event(), south_instance.messages_per_event()
        assert dict(north_sent) == {event_id: 1 for event_id in north_events[1:]}
        assert dict(south_sent) == {event_id: 1 for event_id in south_events}
        # The test means something only if the instances did number alike.
        north_ids = {host.status(event_id).message_id for event_id in north_events[1:]}
        south_ids = {host.status(event_id).message_id for event_id in south_events}
        assert north_ids & south_ids, (north_ids, south_ids)
