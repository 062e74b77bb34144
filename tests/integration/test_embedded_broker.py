"""The embedded broker: a message is whole when a worker sees it, and one worker takes it.

Kombu's own file transport wrote a message file after creating it under its final name, and a
worker of the demo in CI took it in between and died on an empty message. These tests run real
processes against one folder: writers and takers at once.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from queue import Empty
from typing import Any

from kombu import Connection

from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.queues import broker_transport, broker_transport_options
from dispatcher.tracking.webhooks.deliveries import CeleryOutcomePublisher

QUEUE = "race"
WRITERS = 2
TAKERS = 3
MESSAGES_PER_WRITER = 400


def _connection(folder: Path) -> Connection:
    url = f"filesystem://{folder}"
    return Connection(url, transport=broker_transport(url), transport_options=broker_transport_options(url))


def _write(folder: Path, writer: int) -> None:
    with _connection(folder) as connection:
        queue = connection.SimpleQueue(QUEUE)
        for number in range(MESSAGES_PER_WRITER):
            queue.put({"writer": writer, "number": number})
        queue.close()


def _take(folder: Path, taken: multiprocessing.Queue[object]) -> None:
    with _connection(folder) as connection:
        queue = connection.SimpleQueue(QUEUE)
        while True:
            try:
                message = queue.get(timeout=2)  # the writers are done when none comes for 2 s
            except Empty:
                break
            taken.put(message.payload)
            message.ack()
        queue.close()


def test_messages_written_and_taken_at_once_arrive_whole_and_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    taken: multiprocessing.Queue[object] = context.Queue()
    total = WRITERS * MESSAGES_PER_WRITER
    takers = [context.Process(target=_take, args=(tmp_path, taken)) for _ in range(TAKERS)]
    writers = [context.Process(target=_write, args=(tmp_path, number)) for number in range(WRITERS)]
    for process in takers + writers:
        process.start()
    received = [taken.get(timeout=120) for _ in range(total)]
    for process in takers + writers:
        process.join(timeout=60)
    assert [process.exitcode for process in takers + writers] == [0] * (TAKERS + WRITERS)
    assert sorted((item["writer"], item["number"]) for item in received) == [  # type: ignore[index]
        (writer, number) for writer in range(WRITERS) for number in range(MESSAGES_PER_WRITER)
    ]
    assert taken.empty()
    assert not [name for name in (tmp_path / "taken").iterdir()]  # nothing left behind by a taker


def test_every_celery_app_uses_the_atomic_transport_for_filesystem_urls(tmp_path: Path) -> None:
    url = f"filesystem://{tmp_path}/broker"
    apps = {"producer": CeleryEnqueuer(url)._app, "receiver": CeleryOutcomePublisher(url)._app}
    for name, app in apps.items():
        with app.connection_for_write() as connection:
            assert type(connection.transport).__module__ == "dispatcher.embedded_broker", name
    # The worker app is built from the environment at import: ask a fresh interpreter.
    environment = {**os.environ, "DISPATCHER_BROKER_URL": url, "DISPATCHER_API_URL": "http://127.0.0.1:9",
                   "DISPATCHER_ACCOUNT_ID": "1", "DISPATCHER_API_TOKEN": "not-used"}
    probe = "from workers.app import app\nwith app.connection_for_write() as c: print(type(c.transport).__module__)"
    answer = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, text=True, check=True)
    assert answer.stdout.strip() == "dispatcher.embedded_broker"
    assert broker_transport("redis://127.0.0.1:6379/0") is None


def test_binding_a_queue_never_leaves_its_exchange_table_half_written(tmp_path: Path, monkeypatch: Any) -> None:
    """Kombu's ``_queue_bind`` created the exchange's table, then locked and wrote it: a worker
    binding in between (several starting at once) read it empty and died (CI met it in the test
    above). The table must only ever be replaced whole, by a rename, and every binding kept."""
    written_in_place: list[str] = []
    real_open = Path.open

    def watched_open(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self.suffix == ".exchange" and any(flag in mode for flag in "wa+"):
            written_in_place.append(f"{self.name} {mode}")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", watched_open)
    with _connection(tmp_path) as connection:
        for name in ("first", "second", "first"):
            connection.SimpleQueue(name).close()
        channel = connection.default_channel
        bound = {name: [entry.queue for entry in channel.get_table(name)] for name in ("first", "second")}
    assert written_in_place == []
    assert bound == {"first": ["first"], "second": ["second"]}  # each binding once, bound twice or not
