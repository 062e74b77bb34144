"""The Celery app: queues, late acks, redelivery when a worker process dies, JSON only.

``celery -A workers.app worker`` (or ``dispatcher worker``) runs it. Settings come from the
environment like everywhere else; task and queue names from :mod:`dispatcher.queues`.
"""

from __future__ import annotations

from celery import Celery
from kombu.entity import Exchange, Queue

from dispatcher.queues import (
    CALLBACKS_TASK,
    MAINTENANCE_QUEUE,
    OUTCOME_TASK,
    OUTCOMES_QUEUE,
    OUTCOMES_TASK,
    READ_BACK_TASK,
    RECORD_TASK,
    RETENTION_TASK,
    SEND_QUEUE,
    SEND_TASK,
    SWEEP_TASK,
    TRACKING_SWEEP_TASK,
    broker_transport,
    broker_transport_options,
)
from dispatcher.settings import Settings, load_settings
from workers.bounded_stop import BoundedStopAfterFailure


def create_app(settings: Settings) -> Celery:
    app = Celery("dispatcher", broker=settings.broker_url, include=["workers.tasks", "workers.signals"])
    app.conf.update(
        # A task is acknowledged after it ran, and given back when its process dies mid-run:
        # at least once. The send path's compare-and-set and recovery keep it to one message.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        broker_transport=broker_transport(settings.broker_url),
        broker_transport_options=broker_transport_options(
            settings.broker_url, visibility_timeout_s=settings.broker_visibility_timeout_s
        ),
        broker_connection_retry_on_startup=True,
        # Each queue its own direct exchange and routing key, so a route by queue name always lands.
        # Every workspace's send lanes (docs/priorities.md) are declared and consumed by every send worker.
        task_queues=[Queue(name, Exchange(name, type="direct"), routing_key=name)  # type: ignore[no-untyped-call]
                     for name in (*settings.send_queues, OUTCOMES_QUEUE, MAINTENANCE_QUEUE)],
        task_default_queue=SEND_QUEUE,
        task_routes={
            SEND_TASK: {"queue": SEND_QUEUE},
            OUTCOME_TASK: {"queue": OUTCOMES_QUEUE},
            OUTCOMES_TASK: {"queue": OUTCOMES_QUEUE},
            READ_BACK_TASK: {"queue": OUTCOMES_QUEUE},
            RECORD_TASK: {"queue": OUTCOMES_QUEUE},
            SWEEP_TASK: {"queue": MAINTENANCE_QUEUE},
            TRACKING_SWEEP_TASK: {"queue": MAINTENANCE_QUEUE},
            RETENTION_TASK: {"queue": MAINTENANCE_QUEUE},
            CALLBACKS_TASK: {"queue": MAINTENANCE_QUEUE},
        },
        # Flower reads task events; arguments are IDs only, and argsrepr says so.
        worker_send_task_events=True,
        task_send_sent_event=True,
        beat_schedule={
            "sweep": {
                "task": SWEEP_TASK,
                "schedule": settings.sweep_interval_s,
                "options": {"queue": MAINTENANCE_QUEUE, "expires": settings.sweep_interval_s * 2},
            },
            "track": {
                "task": TRACKING_SWEEP_TASK,
                "schedule": settings.sweep_interval_s,
                "options": {"queue": MAINTENANCE_QUEUE, "expires": settings.sweep_interval_s * 2},
            },
            "retention": {
                "task": RETENTION_TASK,
                "schedule": settings.retention_interval_s,
                "options": {"queue": MAINTENANCE_QUEUE, "expires": settings.retention_interval_s},
            },
            **({"callbacks": {  # only where a URL takes them: nothing is written otherwise
                "task": CALLBACKS_TASK,
                "schedule": settings.sweep_interval_s,
                "options": {"queue": MAINTENANCE_QUEUE, "expires": settings.sweep_interval_s * 2},
            }} if settings.callbacks_on else {}),
        },
        worker_hijack_root_logger=False,
    )
    app.steps["worker"].add(BoundedStopAfterFailure)  # a worker that gave up exits, never hangs alive
    return app


app = create_app(load_settings())
