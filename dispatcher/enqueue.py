"""Hand notification IDs to the send queue. IDs only: content never travels through the broker."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from celery import Celery

from dispatcher.queues import (
    OUTCOME_TASK,
    OUTCOMES_QUEUE,
    SEND_QUEUE,
    SEND_TASK,
    broker_transport,
    broker_transport_options,
    send_queues,
)

log = logging.getLogger(__name__)


class Enqueuer(Protocol):
    def enqueue_send(self, notification_ids: Iterable[int], *, queue: str = SEND_QUEUE) -> list[int]:
        """Publish send tasks to ``queue`` (their workspace's and priority's,
        :func:`dispatcher.queues.send_queue`); return the IDs that reached the broker."""
        ...


class RelayEnqueuer(Enqueuer, Protocol):
    """What the sweep publishes through: it also looks at the send queue once per sweep."""

    def send_queue_depth(self) -> int | None:
        """Send tasks waiting in the broker's send queues now (every lane), not those workers
        hold (running, prefetched, a countdown's); None when the broker cannot tell."""
        ...


class CeleryEnqueuer:
    """Publishes by task name, so the host process needs no worker code."""

    def __init__(self, broker_url: str, *, queues: Sequence[str] | None = None) -> None:
        """``queues``: every send queue of the deployment (``Settings.send_queues``), whose depth
        the sweep reads; by default the default workspace's lanes."""
        self._send_queues = list(queues) if queues is not None else send_queues(())
        self._app = Celery("dispatcher-producer", broker=broker_url, set_as_current=False)
        self._app.conf.broker_transport = broker_transport(broker_url)
        self._app.conf.broker_transport_options = broker_transport_options(broker_url)
        self._app.conf.broker_connection_retry_on_startup = False
        self._app.conf.task_serializer = "json"

    def enqueue_send(self, notification_ids: Iterable[int], *, queue: str = SEND_QUEUE) -> list[int]:
        ids = list(notification_ids)
        if len(ids) > 1:
            return self._publish_batch(ids, queue)
        published = []
        for notification_id in ids:
            try:
                self._publish(SEND_TASK, queue, notification_id, shown=f"(notification={notification_id})")
            except Exception as error:  # the broker is down: the sweep publishes the row later
                log.warning("could not enqueue notification %s (%s); the sweep will", notification_id, type(error).__name__)
                continue
            published.append(notification_id)
        return published

    def _publish_batch(self, ids: list[int], queue: str) -> list[int]:
        """The relay's batches, through one producer and kombu's batch publish (one Redis pipeline):
        twice the rate of a publish each, whose Redis client kombu builds anew every time. A batch
        that fails counts as not published at all: the sweep publishes it again, and a task that
        did get through twice is harmless (the send path claims each attempt once)."""
        try:
            with self._app.producer_or_acquire() as producer, producer.batch(max_size=len(ids)):
                for notification_id in ids:
                    self._publish(SEND_TASK, queue, notification_id, shown=f"(notification={notification_id})",
                                  producer=producer)
        except Exception as error:
            log.warning("could not enqueue %d notifications (%s); the sweep will", len(ids), type(error).__name__)
            return []
        return ids

    def send_queue_depth(self) -> int | None:
        """The send queues' waiting tasks, summed, by a passive declare each (it creates nothing): kombu sums a
        Redis queue's priority lists and counts the filesystem transport's message files, and
        RabbitMQ answers with its ready messages. A queue that does not exist holds nothing: an
        empty Redis list has no key, and a RabbitMQ queue no worker has declared yet is not there.
        None when the broker did not answer (the sweep then judges by age alone, as before).
        A channel of its own, closed after: a refused passive declare closes it on RabbitMQ."""
        try:
            with self._app.connection_for_write() as connection:
                return sum(_depth(connection, queue) for queue in self._send_queues)
        except Exception as error:
            log.warning("could not read the send queues' depth (%s)", type(error).__name__)
            return None

    def enqueue_outcome(self, delivery_row_id: int) -> None:
        """Publish the outcome task for one recorded webhook delivery (its row ID only)."""
        self._publish(OUTCOME_TASK, OUTCOMES_QUEUE, delivery_row_id, shown=f"(delivery={delivery_row_id})")

    def outcome_queue_depth(self) -> int | None:
        """The outcome tasks waiting in the broker's outcomes queue (not those consumers hold), as
        :meth:`send_queue_depth` reads the send queues; None when the broker did not answer."""
        try:
            with self._app.connection_for_write() as connection:
                return _depth(connection, OUTCOMES_QUEUE)
        except Exception as error:
            log.warning("could not read the outcomes queue's depth (%s)", type(error).__name__)
            return None

    def _publish(self, task: str, queue: str, row_id: int, *, shown: str, producer: Any = None) -> None:
        # argsrepr is what Flower and the worker log display: the ID, said plainly.
        self._app.send_task(
            task,
            args=[row_id],
            queue=queue,
            argsrepr=shown,
            kwargsrepr="{}",
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5},
            producer=producer,
        )

    def close(self) -> None:
        self._app.close()


def _depth(connection: Any, queue: str) -> int:
    channel = connection.channel()
    try:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except Exception as error:
        if _not_found(error):
            return 0
        raise
    finally:
        with contextlib.suppress(Exception):
            channel.close()


def _not_found(error: Exception) -> bool:
    """A passive declare's "no such queue": py-amqp's NotFound (code 404), kombu's virtual
    transports' ChannelError ("NOT_FOUND - no queue ...")."""
    return getattr(error, "code", None) == 404 or "NOT_FOUND" in str(error)


class ListEnqueuer:
    """Keeps the IDs in a list: for tests and for callers that publish themselves."""

    def __init__(self, queue_depth: int | None = None) -> None:
        self.sent: list[int] = []
        self.queues: dict[int, str] = {}  # the queue each ID was published to, last
        self.outcomes: list[int] = []
        self.queue_depth = queue_depth  # what send_queue_depth says: None, it cannot tell
        self.outcome_depth: int | None = None  # what outcome_queue_depth says

    def send_queue_depth(self) -> int | None:
        return self.queue_depth

    def enqueue_send(self, notification_ids: Iterable[int], *, queue: str = SEND_QUEUE) -> list[int]:
        ids = list(notification_ids)
        self.sent.extend(ids)
        self.queues.update(dict.fromkeys(ids, queue))
        return ids

    def enqueue_outcome(self, delivery_row_id: int) -> None:
        self.outcomes.append(delivery_row_id)

    def outcome_queue_depth(self) -> int | None:
        return self.outcome_depth
