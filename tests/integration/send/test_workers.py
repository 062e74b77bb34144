"""The durable send path with real parts: Celery worker processes and beat, Redis as broker and
shared limiter, PostgreSQL as the store, the sandbox over HTTP on loopback.

Each test counts, from the sandbox's own record, the messages per business event.
"""

from __future__ import annotations

import multiprocessing
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings
from dispatcher.store.migrate import upgrade_database
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.sandbox_process import SandboxProcess
from tests.support.worker_process import (
    ProcessGroup,
    dispatcher_environment,
    fresh_broker_url,
    process_group,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ACCEPTED_STATES = {"accepted", "sent", "delivered", "read"}


@pytest.fixture()
def setup(
    sandbox: SandboxProcess, fresh_postgres_url: str, redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> Iterator[tuple[Dispatcher, ProcessGroup]]:
    sandbox.reset()
    broker_url = fresh_broker_url(redis_url)
    upgrade_database(fresh_postgres_url)
    env = dispatcher_environment(api_url=sandbox.base_url, database_url=fresh_postgres_url, broker_url=broker_url)
    settings = _settings_from(env)
    dispatcher = Dispatcher(settings, enqueuer=CeleryEnqueuer(broker_url))
    with process_group(env, tmp_path) as group:
        yield dispatcher, group


def _settings_from(env: dict[str, str], **more: Any) -> Settings:
    overrides = {key.removeprefix("DISPATCHER_").lower(): value for key, value in env.items()
                 if key.startswith("DISPATCHER_") and key not in ("DISPATCHER_CONFIG",) and not key.startswith("DISPATCHER_TEST_")}
    return example_settings(**overrides, **more)


def _states(dispatcher: Dispatcher, event_ids: list[str]) -> Counter[str]:
    return Counter(dispatcher.status(event_id).state for event_id in event_ids)


def _all_accepted(dispatcher: Dispatcher, event_ids: list[str]) -> bool:
    return all(dispatcher.status(event_id).message_id is not None for event_id in event_ids)


def _phone(number: int) -> str:
    return f"+1555031{number:04d}"


def test_two_hundred_notifications_for_fifty_contacts(setup: tuple[Dispatcher, ProcessGroup], sandbox: SandboxProcess) -> None:
    dispatcher, group = setup
    group.start_worker("w1")
    group.start_worker("w2")
    group.start_beat()
    # Given 200 reminders for 50 new contacts, four each, handed over at once (workers race)
    events = [f"bulk-{contact}-{n}" for n in range(4) for contact in range(50)]
    for event_id in events:
        contact = int(event_id.split("-")[1])
        dispatcher.notify(reminder(event_id, identifier=f"bulk-patient-{contact}", phone=_phone(contact)))
    # When the workers have sent them
    wait_until(lambda: _all_accepted(dispatcher, events), timeout_s=120, what="200 accepted notifications")
    # Then every event has exactly one message, and each contact one conversation
    per_event = sandbox.messages_per_event()
    assert {event: per_event[event] for event in events} == {event: 1 for event in events}
    messages = sandbox.messages()
    conversations_per_contact = Counter()
    for contact_id in {m["contact_id"] for m in messages}:
        conversations_per_contact[contact_id] = len({m["conversation_id"] for m in messages if m["contact_id"] == contact_id})
    assert len(conversations_per_contact) == 50
    assert set(conversations_per_contact.values()) == {1}
    calls = sandbox.stats()["calls"]
    assert calls["createMessage"] == 200
    assert calls["createConversation"] == 50

    # And, measured apart: a new contact costs at most 4 calls, a known one exactly 1
    before = dict(sandbox.stats()["calls"])
    fresh = [f"measure-new-{n}" for n in range(10)]
    for n, event_id in enumerate(fresh):
        dispatcher.notify(reminder(event_id, identifier=f"measure-patient-{n}", phone=_phone(100 + n)))
    wait_until(lambda: _all_accepted(dispatcher, fresh), timeout_s=60, what="10 new-contact notifications")
    middle = dict(sandbox.stats()["calls"])
    known = [f"measure-known-{n}" for n in range(10)]
    for n, event_id in enumerate(known):
        dispatcher.notify(reminder(event_id, identifier=f"measure-patient-{n}", phone=_phone(100 + n)))
    wait_until(lambda: _all_accepted(dispatcher, known), timeout_s=60, what="10 known-contact notifications")
    after = dict(sandbox.stats()["calls"])

    def spent(start: dict[str, int], end: dict[str, int]) -> dict[str, int]:
        return {op: end.get(op, 0) - start.get(op, 0) for op in end if op != "listInboxes" and end.get(op, 0) != start.get(op, 0)}

    assert sum(spent(before, middle).values()) <= 4 * 10
    assert spent(middle, after) == {"createMessage": 10}
    _assert_nothing_private_in(group.logs() + sandbox.stderr_text())


def _hand_over_many(arguments: tuple[dict[str, str], dict[str, Any], int]) -> list[str]:
    env, request, times = arguments
    import os

    os.environ.update(env)
    from dispatcher.service import Dispatcher
    from dispatcher.settings import load_settings

    local = Dispatcher(load_settings())
    return [local.notify(request).event_id for _ in range(times)]


def test_the_same_event_a_hundred_times_from_several_processes_is_one_message(
    setup: tuple[Dispatcher, ProcessGroup], sandbox: SandboxProcess
) -> None:
    dispatcher, group = setup
    group.start_worker("w1")
    request = reminder("same-event-100", identifier="same-patient", phone=_phone(500))
    env = {key: value for key, value in group.env.items() if key.startswith("DISPATCHER_")}
    # When four processes hand the same event over 25 times each, at the same moment
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        answers = pool.map(_hand_over_many, [(env, request, 25)] * 4)
    assert sum(len(answer) for answer in answers) == 100
    # Then there is one notification and, once sent, one message
    wait_until(lambda: _all_accepted(dispatcher, ["same-event-100"]), timeout_s=60, what="the notification to be sent")
    time.sleep(1.0)  # any duplicate task would have sent by now
    assert sandbox.messages_per_event()["same-event-100"] == 1
    assert sandbox.stats()["calls"]["createMessage"] == 1


def test_dropped_responses_and_killed_workers_lose_nothing_and_duplicate_nothing(
    setup: tuple[Dispatcher, ProcessGroup], sandbox: SandboxProcess
) -> None:
    dispatcher, group = setup
    # Given the sandbox commits a fifth of createMessage calls and then drops the response
    sandbox.set_faults({"createMessage": {"drop_response_share": 0.2, "latency_s": 0.02}})
    group.start_worker("w1", concurrency=3)
    group.start_worker("w2", concurrency=3)
    group.start_beat()
    events = [f"chaos-{n}" for n in range(120)]
    for n, event_id in enumerate(events):
        dispatcher.notify(reminder(event_id, identifier=f"chaos-patient-{n % 40}", phone=_phone(600 + n % 40)))
    # When worker processes are killed with SIGKILL at random moments while they send
    rng = random.Random(20261122)
    kills = 0
    stop = threading.Event()

    def killer() -> None:
        nonlocal kills
        while not stop.is_set() and kills < 30:
            time.sleep(rng.uniform(0.05, 0.4))
            group.ensure_running()
            name = rng.choice(["w1", "w2"])
            if kills in (10, 20):  # now and then the whole worker, not just a pool process
                group.stop(name, kill=True)
                group.start_worker(name, concurrency=3)
                kills += 1
                continue
            children = group.pool_children(name)
            if children:
                try:
                    rng.choice(children).kill()
                    kills += 1
                except psutil.NoSuchProcess:
                    pass

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        wait_until(lambda: kills >= 30, timeout_s=90, what="30 kills")
    finally:
        stop.set()
        thread.join(timeout=5)
    # Then, once the system settles (with every worker up again, as its supervisor would see to),
    # every event has exactly one message: no loss, no duplicate
    try:
        wait_until(lambda: group.ensure_running() or _all_accepted(dispatcher, events), timeout_s=120,
                   what="every notification accepted")
    except AssertionError:
        stuck = [dispatcher.status(event) for event in events if dispatcher.status(event).message_id is None]
        print("stuck:", [(r.event_id, r.state, [(a.state, a.tries, a.error_kind) for a in r.attempts]) for r in stuck][:10])
        raise
    time.sleep(1.5)
    per_event = sandbox.messages_per_event()
    for event, count in per_event.items():
        if count != 1:
            record = dispatcher.status(event)
            print("DUPLICATE", event, count, record.model_dump_json())
            print("MESSAGES", [m for m in sandbox.messages() if (m.get("content") or "").startswith(f"Reminder {event}:")])
            import shutil
            shutil.copytree(group.log_dir, "/tmp/dup-logs", dirs_exist_ok=True)
    assert {event: per_event[event] for event in events} == {event: 1 for event in events}
    assert sum(per_event.values()) == len(events)
    assert kills >= 30
    stats = sandbox.stats()
    outcomes = Counter(re.findall(r"succeeded in [0-9.]+s: '(\w+)'", group.logs()))
    print("sandbox faults:", stats["faults"], "calls:", stats["calls"], "task outcomes:", dict(outcomes))
    assert stats["faults"]["createMessage"]["drop"] > 0, "the fault never fired: the test proved nothing"
    assert outcomes["adopted"] > 0, "no dropped response was recovered by reading the conversation"
    # Not one message too many (a call cut off by a kill mid-request is counted, never stored).
    assert len(sandbox.messages()) == len(events)
    _assert_nothing_private_in(group.logs() + sandbox.stderr_text())


PRIVATE = [re.compile(r"\+1555\d{7}"), re.compile(r"Reminder \S+: your appointment"), re.compile("sandbox-token-account-1"),
           re.compile(r"Test Patient")]


def _assert_nothing_private_in(text: str) -> None:
    assert text.strip(), "no process output was captured"
    for pattern in PRIVATE:
        found = pattern.search(text)
        assert found is None, f"private data in process output: {pattern.pattern!r}"
