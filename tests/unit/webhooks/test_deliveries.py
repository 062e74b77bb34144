"""record_deliveries on SQLite, and the Celery publisher's messages (in-memory broker)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from kombu import Connection

from dispatcher.queues import OUTCOMES_PER_TASK
from dispatcher.tracking.webhooks.deliveries import CeleryOutcomePublisher, NewDelivery, record_deliveries

from .conftest import migrated_store

AT = datetime(2026, 5, 28, 20, 26, 40, tzinfo=UTC)


def delivery(delivery_id: str, message_id: int = 1) -> NewDelivery:
    return NewDelivery(delivery_id, "message_updated", {"event": "message_updated", "message_id": message_id}, AT)


def test_a_batch_is_recorded_once_per_delivery_id(tmp_path: Path) -> None:
    sessions = migrated_store(tmp_path)
    first = record_deliveries(sessions, [delivery("a"), delivery("b")])
    assert all(isinstance(row_id, int) for row_id in first) and first[0] != first[1]
    # a retry of "a", a new "c" twice in the same batch, and "b" again
    second = record_deliveries(sessions, [delivery("a"), delivery("c", 3), delivery("c", 4), delivery("b")])
    assert second[0] is None and second[3] is None
    assert isinstance(second[1], int) and second[2] is None
    with sessions() as session:
        rows = session.execute(sa.text("SELECT delivery_id, summary FROM webhook_deliveries ORDER BY id")).all()
    assert [row.delivery_id for row in rows] == ["a", "b", "c"]
    assert '"message_id": 3' in rows[2].summary  # the first occurrence wins


def test_the_publisher_writes_celery_task_messages_with_ids_only() -> None:
    broker = "memory://receiver-unit"
    publisher = CeleryOutcomePublisher(broker)
    try:
        publisher.publish_many([11, 12])  # a group commit's rows: one task applies them together
        publisher(13)
        publisher.publish_many([14])
        publisher.publish_many(list(range(1000, 1000 + OUTCOMES_PER_TASK + 1)))  # one task per OUTCOMES_PER_TASK rows
    finally:
        publisher.close()
    with Connection(broker) as connection:
        queue = connection.SimpleQueue("dispatcher.outcomes")
        messages = [queue.get(timeout=1) for _ in range(5)]
        queue.close()
    assert [m.headers["task"] for m in messages] == ["dispatcher.outcomes", "dispatcher.outcome", "dispatcher.outcome",
                                                     "dispatcher.outcomes", "dispatcher.outcomes"]
    assert [m.headers["argsrepr"] for m in messages] == ["(deliveries=2)", "(delivery=13)", "(delivery=14)",
                                                         f"(deliveries={OUTCOMES_PER_TASK})", "(deliveries=1)"]
    assert [m.payload[0] for m in messages] == [[[11, 12]], [13], [14], [list(range(1000, 1000 + OUTCOMES_PER_TASK))],
                                                [[1000 + OUTCOMES_PER_TASK]]]


def test_every_task_is_published_to_run_at_once() -> None:
    broker = "memory://receiver-unit-eta"
    publisher = CeleryOutcomePublisher(broker)
    try:
        publisher.publish_many([21, 22])  # status-less events too: a message's first read is made at once
        publisher.publish_many([23])
    finally:
        publisher.close()
    with Connection(broker) as connection:
        queue = connection.SimpleQueue("dispatcher.outcomes")
        together, alone = queue.get(timeout=1), queue.get(timeout=1)
        queue.close()
    assert (together.headers["eta"], alone.headers["eta"]) == (None, None)
