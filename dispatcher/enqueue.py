"""Hand notification IDs to the send queue. IDs only: content never travels through the broker."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from celery import Celery

from dispatcher.queues import OUTCOME_TASK, OUTCOMES_QUEUE, SEND_QUEUE, SEND_TASK, broker_transport, broker_transport_options

log = logging.getLogger(__name__)


class Enqueuer(Protocol):
    def enqueue_send(self, notification_ids: Iterable[int]) -> list[int]:
        """Publish send tasks; return the IDs that reached the broker."""
        ...


class CeleryEnqueuer:
    """Publishes by task name, so the host process needs no worker code."""

    def __init__(self, broker_url: str) -> None:
        self._app = Celery("dispatcher-producer", broker=broker_url, set_as_current=False)
        self._app.conf.broker_transport = broker_transport(broker_url)
        self._app.conf.broker_transport_options = broker_transport_options(broker_url)
        self._app.conf.broker_connection_retry_on_startup = False
        self._app.conf.task_serializer = "json"

    def enqueue_send(self, notification_ids: Iterable[int]) -> list[int]:
        published = []
        for notification_id in notification_ids:
            try:
                self._publish(SEND_TASK, SEND_QUEUE, notification_id, shown=f"(notification={notification_id})")
            except Exception as error:  # the broker is down: the sweep publishes the row later
                log.warning("could not enqueue notification %s (%s); the sweep will", notification_id, type(error).__name__)
                continue
            published.append(notification_id)
        return published

    def enqueue_outcome(self, delivery_row_id: int) -> None:
        """Publish the outcome task for one recorded webhook delivery (its row ID only)."""
        self._publish(OUTCOME_TASK, OUTCOMES_QUEUE, delivery_row_id, shown=f"(delivery={delivery_row_id})")

    def _publish(self, task: str, queue: str, row_id: int, *, shown: str) -> None:
        # argsrepr is what Flower and the worker log display: the ID, said plainly.
        self._app.send_task(
            task,
            args=[row_id],
            queue=queue,
            argsrepr=shown,
            kwargsrepr="{}",
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5},
        )

    def close(self) -> None:
        self._app.close()


class ListEnqueuer:
    """Keeps the IDs in a list: for tests and for callers that publish themselves."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.outcomes: list[int] = []

    def enqueue_send(self, notification_ids: Iterable[int]) -> list[int]:
        ids = list(notification_ids)
        self.sent.extend(ids)
        return ids

    def enqueue_outcome(self, delivery_row_id: int) -> None:
        self.outcomes.append(delivery_row_id)
