"""A notification's priority (docs/priorities.md): the request's, else its route's; stored, shown in
its record, and its send tasks published to its workspace's lane of that priority, by intake, the
batch, the relay and the command line. SQLite store, a list in place of the broker."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import EventConflict, InvalidEvent
from dispatcher.intake import outbox
from dispatcher.operations.sweep import sweep
from dispatcher.queues import SEND_QUEUE, URGENT_QUEUE, Priority, send_queue, send_queues
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings
from dispatcher.store.migrate import upgrade_database
from tests.support.dispatcher_setup import EXAMPLE, example_settings, reminder

PHONE = "+15550308888"
NORTH = {"api_url": "http://127.0.0.1:9", "account_id": 7, "api_token": "north-api-token-0123456789"}


def _settings(url: str, *, urgent_route: str | None = None) -> Settings:
    routes: dict[str, Any] = tomllib.loads(EXAMPLE.read_text())["routes"]
    if urgent_route is not None:
        routes[urgent_route] = {**routes[urgent_route], "priority": "urgent"}
    return example_settings(api_url="http://127.0.0.1:9", database_url=url, routes=routes, workspaces={"north": NORTH})


@pytest.fixture()
def enqueuer() -> ListEnqueuer:
    return ListEnqueuer()


@pytest.fixture()
def dispatcher(tmp_path: Path, enqueuer: ListEnqueuer, clean_environment: pytest.MonkeyPatch) -> Iterator[Dispatcher]:
    url = f"sqlite:///{tmp_path}/store.sqlite"
    upgrade_database(url)
    yield Dispatcher(_settings(url, urgent_route="sms"), enqueuer=enqueuer)


def test_each_workspace_and_priority_has_its_queue_and_the_default_normal_one_keeps_its_name() -> None:
    assert send_queue("default", Priority.NORMAL) == SEND_QUEUE == "dispatcher.send"
    assert send_queue("default", Priority.URGENT) == URGENT_QUEUE
    assert send_queue("north", Priority.NORMAL) == "dispatcher.send.north"
    assert send_queue("north", Priority.URGENT) == "dispatcher.urgent.north"
    # a workspace named like a lane cannot collide: its queue has a dot the lanes' names lack
    assert send_queue("urgent", Priority.NORMAL) not in (URGENT_QUEUE, SEND_QUEUE)
    assert send_queues(["north"]) == ["dispatcher.urgent", "dispatcher.urgent.north", "dispatcher.send",
                                      "dispatcher.send.north"]


def test_the_request_s_priority_else_the_route_s_chooses_the_lane(dispatcher: Dispatcher, enqueuer: ListEnqueuer) -> None:
    normal = dispatcher.notify(reminder("p-normal", identifier="p-1", phone=PHONE))
    urgent = dispatcher.notify(reminder("p-urgent", identifier="p-2", phone=PHONE, priority="urgent"))
    by_route = dispatcher.notify(reminder("p-route", identifier="p-3", phone=PHONE, route="sms", template=None))
    overruled = dispatcher.notify(reminder("p-said-normal", identifier="p-4", phone=PHONE, route="sms", template=None,
                                           priority="normal"))
    north = dispatcher.notify(reminder("p-north", identifier="p-5", phone=PHONE, workspace="north", priority="urgent"))
    assert [record.priority for record in (normal, urgent, by_route, overruled, north)] == [
        "normal", "urgent", "urgent", "normal", "urgent"]
    assert list(enqueuer.queues.values()) == [SEND_QUEUE, URGENT_QUEUE, URGENT_QUEUE, SEND_QUEUE,
                                              "dispatcher.urgent.north"]
    assert dispatcher.status("p-urgent").priority == "urgent"  # stored, not only answered


def test_a_priority_is_part_of_the_request_and_a_bad_one_is_named(dispatcher: Dispatcher) -> None:
    dispatcher.notify(reminder("p-same", identifier="p-1", phone=PHONE))
    with pytest.raises(EventConflict):  # the same event, now urgent: another request
        dispatcher.notify(reminder("p-same", identifier="p-1", phone=PHONE, priority="urgent"))
    with pytest.raises(InvalidEvent) as refused:
        dispatcher.notify(reminder("p-bad", identifier="p-1", phone=PHONE, priority="asap"))
    assert refused.value.field == "priority" and "asap" not in str(refused.value)


def test_a_batch_publishes_each_item_to_its_lane(dispatcher: Dispatcher, enqueuer: ListEnqueuer) -> None:
    items = [reminder(f"b-{number}", identifier=f"p-{number}", phone=PHONE,
                      **({"priority": "urgent"} if number % 3 == 0 else {})) for number in range(6)]
    items.append(reminder("b-north", identifier="p-9", phone=PHONE, workspace="north"))
    assert all(item.outcome == "accepted" for item in dispatcher.notify_many(items))
    lanes = {dispatcher.status(event_id).priority for event_id in ("b-0", "b-3")}
    assert lanes == {"urgent"}
    assert sorted(enqueuer.queues.values()) == sorted([URGENT_QUEUE] * 2 + [SEND_QUEUE] * 4 + ["dispatcher.send.north"])


def test_the_relay_publishes_urgent_rows_first_each_to_its_lane(dispatcher: Dispatcher) -> None:
    with dispatcher.sessions.begin() as session:  # the outbox: rows the sweep publishes
        for number in range(4):
            outbox.add(session, reminder(f"o-{number}", identifier=f"p-{number}", phone=PHONE,
                                         **({"priority": "urgent"} if number >= 2 else {})), settings=dispatcher.settings)
    relay = ListEnqueuer()
    assert sweep(sessions=dispatcher.sessions, enqueuer=relay, stale_after_s=45) == 4
    assert [relay.queues[notification_id] for notification_id in relay.sent] == [URGENT_QUEUE] * 2 + [SEND_QUEUE] * 2
    assert relay.sent[:2] == sorted(relay.sent)[2:]  # the two urgent ones, handed over last, went first
