"""Cross-cutting hooks of the worker processes."""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery.signals import celeryd_after_setup, worker_init, worker_process_init, worker_process_shutdown, worker_ready

from dispatcher import tracing
from dispatcher.api.client import quiet_http_logging
from dispatcher.context import require_shared_limits
from dispatcher.errors import EXIT_CONFIGURATION, ConfigurationError
from dispatcher.queues import SEND_QUEUE
from dispatcher.settings import load_settings
from dispatcher.store.db import dispose_after_fork


@worker_init.connect
def _refuse_limits_of_its_own(**_: object) -> None:
    # Before the pool starts: a worker that would not share the workspace's limits must not run.
    # Celery logs and swallows an Exception from a signal handler, so this ends the process itself.
    try:
        settings = load_settings()
        require_shared_limits(settings)
        tracing.check_available(settings)
    except ConfigurationError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIGURATION) from None  # as the command line's (docs/operations.md)


@celeryd_after_setup.connect
def _consume_every_send_lane(instance: Any = None, **_: object) -> None:
    # A worker that sends (it consumes dispatcher.send) consumes every send lane: the urgent
    # queues and each workspace's (docs/priorities.md), whatever --queues named. A worker started
    # with the list from before lanes existed must not leave urgent sends in a queue nobody reads.
    queues = instance.app.amqp.queues
    if SEND_QUEUE not in queues.consume_from:
        return
    for name in load_settings().send_queues:
        if name not in queues.consume_from:  # the Queue task_queues declares: its own exchange
            queues.select_add(queues[name])


@worker_process_init.connect
def _after_fork(**_: object) -> None:
    # Pooled database connections inherited from the parent must not be shared with it.
    dispose_after_fork()
    quiet_http_logging()
    logging.getLogger("dispatcher").setLevel(logging.INFO)
    # After the fork: each child exports its own spans (a batch processor's thread does not fork).
    tracing.configure(load_settings(), service="dispatcher-worker")


@worker_ready.connect
def _serve_metrics(**_: object) -> None:
    # In the main process, after the pool started: one endpoint summing every child's metrics.
    from workers import runtime

    settings = runtime.settings()
    if settings.metrics_port is not None:
        from dispatcher.metrics import deployment_collectors, serve_worker_metrics

        serve_worker_metrics(settings.metrics_port, host=settings.metrics_host, sessions=runtime.send_context().sessions,
                             collectors=deployment_collectors(settings))


@worker_process_shutdown.connect
def _flush_spans(**_: object) -> None:
    # A prefork child leaves with os._exit: the spans its batch still holds go out now or never.
    tracing.shutdown()


@worker_process_shutdown.connect
def _forget_child_metrics(pid: int | None = None, **_: object) -> None:
    import os

    if pid is not None and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
