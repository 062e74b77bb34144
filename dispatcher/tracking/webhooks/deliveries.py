"""Record verified deliveries once, by delivery ID, and hand their row IDs to the consumer.

The real service reuses a delivery ID when it retries, so the ID is unique in
``webhook_deliveries``. :func:`record_deliveries` writes a batch in ONE transaction with
``INSERT ... ON CONFLICT (delivery_id) DO NOTHING RETURNING id, delivery_id`` (SQLite and
PostgreSQL, the two stores the dispatcher supports), so a duplicate is no exception. An ID that
comes twice in one batch is recorded once, for its first occurrence.

Guarantee: rows are committed before their IDs are published; publishing is at least once (the
tracking sweep publishes rows that stay unprocessed), so the consumer must be idempotent.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.errors import ConfigurationError
from dispatcher.queues import (
    OUTCOME_TASK,
    OUTCOMES_PER_TASK,
    OUTCOMES_QUEUE,
    OUTCOMES_TASK,
    RECORD_TASK,
    broker_transport,
    broker_transport_options,
)
from dispatcher.store import deliveries as stored

Publish = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class NewDelivery:
    delivery_id: str
    event: str
    summary: dict[str, Any]  # EventSummary.model_dump(mode="json"): IDs and status, no personal data
    received_at: datetime
    workspace: str = "default"  # whose webhook it is: the path it came to, whose secret verified it

    def as_task_argument(self) -> dict[str, Any]:
        """JSON for a task's argument: what the store would have kept, no more (no content)."""
        return {"delivery_id": self.delivery_id, "event": self.event, "summary": self.summary,
                "received_at": self.received_at.isoformat(), "workspace": self.workspace}

    @classmethod
    def from_task_argument(cls, value: dict[str, Any]) -> NewDelivery:
        return cls(str(value["delivery_id"]), str(value["event"]), dict(value["summary"]),
                   datetime.fromisoformat(str(value["received_at"])), workspace=str(value["workspace"]))


def row_of(sessions: sessionmaker[Session], delivery_id: str) -> int | None:
    """The row a delivery ID was recorded as, if it was."""
    with sessions() as session:
        return stored.row_of(session, delivery_id)


def record_deliveries(sessions: sessionmaker[Session], deliveries: Sequence[NewDelivery]) -> list[int | None]:
    """Insert and commit; per delivery, in order: its new row ID, or None if recorded before."""
    first: dict[str, int] = {}
    for index, delivery in enumerate(deliveries):
        first.setdefault(delivery.delivery_id, index)
    rows = [stored.StoredDelivery(d.delivery_id, d.event, d.summary, d.received_at, d.workspace, _message_id(d.summary))
            for index, d in enumerate(deliveries) if first[d.delivery_id] == index]
    with sessions() as session:
        dialect = session.get_bind().dialect.name
        if dialect not in ("sqlite", "postgresql"):
            raise ConfigurationError("DISPATCHER_DATABASE_URL", f"the receiver needs SQLite or PostgreSQL, not {dialect}")
        inserted = stored.insert_new(session, rows)
        session.commit()
    return [inserted.get(d.delivery_id) if first[d.delivery_id] == index else None
            for index, d in enumerate(deliveries)]


def _message_id(summary: dict[str, Any]) -> int | None:
    """The message the delivery is about (its column, indexed: a notification's page finds its webhooks)."""
    value = summary.get("message_id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class CeleryOutcomePublisher:
    """Publishes ``dispatcher.outcome`` with a delivery row ID, by task name (no worker code).

    Messages are built by Celery (``app.amqp.as_task_v2``, the same headers ``send_task`` writes,
    with ``argsrepr``) and published through one kombu producer, batched into one Redis pipeline
    by :meth:`publish_many`. Celery's publish signals are not sent. It fails fast (1 s socket
    timeouts, no publish retries): the receiver answers within milliseconds, and a row whose
    publish failed stays unprocessed until the tracking sweep publishes it.
    """

    def __init__(self, broker_url: str) -> None:
        self._app = Celery("dispatcher-receiver", broker=broker_url, set_as_current=False)
        options = broker_transport_options(broker_url)
        if broker_url.startswith(("redis://", "rediss://")):
            options.update(socket_timeout=1.0, socket_connect_timeout=1.0)
        self._app.conf.broker_transport = broker_transport(broker_url)
        self._app.conf.broker_transport_options = options
        self._app.conf.broker_connection_retry_on_startup = False
        self._app.conf.broker_connection_timeout = 1.0
        self._app.conf.task_serializer = "json"
        self._queue = self._app.amqp.queues[OUTCOMES_QUEUE]  # declared on the first publish only
        self._declared = False

    def __call__(self, row_id: int) -> None:
        self.publish_many([row_id])

    def broker_answers(self) -> bool:
        """Whether a connection to the broker can be made now (1 s at most): for readiness."""
        try:
            with self._app.connection_for_write() as connection:
                connection.connect()
        except Exception:  # any transport's refusal means "not ready"; the reason is not ours to echo
            return False
        return True

    def publish_many(self, row_ids: Sequence[int]) -> None:
        """Publish the consumer's tasks for these rows, to run at once: one ``dispatcher.outcome``
        for a single row, else one ``dispatcher.outcomes`` per ``OUTCOMES_PER_TASK`` rows, which
        applies them together (one transaction for those that carry a status). Raises if the broker
        refuses (none may have been sent)."""
        if len(row_ids) == 1:
            self._publish_tasks(OUTCOME_TASK, [(row_ids[0], f"(delivery={row_ids[0]})")])
            return
        chunks = [list(row_ids[start:start + OUTCOMES_PER_TASK]) for start in range(0, len(row_ids), OUTCOMES_PER_TASK)]
        self._publish_tasks(OUTCOMES_TASK, [(chunk, f"(deliveries={len(chunk)})") for chunk in chunks])

    def publish_unrecorded(self, deliveries: Sequence[NewDelivery]) -> None:
        """Hand deliveries the store could not take to the consumer, whole: it records and applies
        them once the store answers (Flower shows the delivery ID only)."""
        self._publish_tasks(RECORD_TASK, [(delivery.as_task_argument(), f"(delivery={delivery.delivery_id})")
                                          for delivery in deliveries])

    def _publish_tasks(self, task_name: str, calls: Sequence[tuple[int | list[int] | dict[str, Any], str]]) -> None:
        if not calls:
            return
        with self._app.producer_or_acquire() as producer:
            batch = producer.batch() if hasattr(producer, "batch") else contextlib.nullcontext()
            with batch:
                for argument, shown in calls:
                    task_id = str(uuid.uuid4())
                    headers, properties, body, _ = self._app.amqp.as_task_v2(
                        task_id, task_name, args=[argument], kwargs={}, argsrepr=shown, kwargsrepr="{}")
                    producer.publish(body, exchange="", routing_key=OUTCOMES_QUEUE, serializer="json",
                                     headers=headers, delivery_mode=2, retry=False,
                                     declare=[] if self._declared else [self._queue], **properties)
        self._declared = True

    def close(self) -> None:
        self._app.close()
