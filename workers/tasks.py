"""Thin tasks: take IDs, call the dispatcher, turn its answer into a retry or an end.

Task arguments are notification IDs only: no content or contact data passes the broker, so
Flower and the logs show nothing private.
"""

from __future__ import annotations

import logging

from celery import Task
from sqlalchemy.exc import InterfaceError, OperationalError

from dispatcher.callbacks.deliver import deliver_due
from dispatcher.context import Wait
from dispatcher.lifecycle.retention import purge
from dispatcher.metrics import SEND_RESULTS
from dispatcher.operations.sweep import sweep as run_sweep
from dispatcher.queues import (
    CALLBACKS_TASK,
    OUTCOME_TASK,
    OUTCOMES_TASK,
    READ_BACK_TASK,
    RECORD_TASK,
    RETENTION_TASK,
    SEND_TASK,
    SWEEP_TASK,
    TRACKING_SWEEP_TASK,
)
from dispatcher.sending.next_run import schedule_next_run
from dispatcher.sending.send import Outcome, send_notification, set_aside_unconfigured
from dispatcher.tracking.outcomes import read_back_message
from dispatcher.tracking.reconcile import process_deliveries, process_delivery, record_and_process, tracking_sweep
from dispatcher.tracking.webhooks.deliveries import NewDelivery
from workers import runtime
from workers.app import app

log = logging.getLogger(__name__)


# While the database does not answer, a task tries again after 1, 2, 4, 8, then every 10 s, and
# so goes on within seconds of its return, instead of waiting for the sweep (stale_after_s, 45 s,
# and behind a backlog until the send queue is empty). Past an hour of this it ends, logged, and
# the sweep takes the row up later.
STORE_RETRY_CAP_S = 10.0
STORE_RETRY_BUDGET = 360


def _store_unavailable(task: Task, what: str, error: Exception) -> Exception:
    countdown = min(2.0 ** min(task.request.retries, 10), STORE_RETRY_CAP_S)
    log.warning("%s: the database did not answer (%s); trying again in %.0f s", what, type(error).__name__, countdown)
    retry: Exception = task.retry(countdown=countdown, max_retries=STORE_RETRY_BUDGET)
    return retry


@app.task(name=SEND_TASK, bind=True, max_retries=None)
def send(self: Task, notification_id: int) -> str:
    """Send one notification's current attempt (at least once; at most one message)."""
    workspace = runtime.workspace_of("notifications", int(notification_id))
    if not runtime.serves(workspace):  # its workspace left the configuration: nothing goes out elsewhere
        return set_aside_unconfigured(int(notification_id), workspace, runtime.send_context()).outcome.value
    context = runtime.send_context(workspace)
    try:
        result = send_notification(int(notification_id), context)
        SEND_RESULTS.labels(result=result.outcome.value).inc()
        if result.outcome is not Outcome.RETRY:
            return result.outcome.value
        # The reason names operations, statuses and error kinds only: never content or contacts.
        log.info("notification %s: retry in %.1fs (%s)", notification_id, result.delay_s, result.reason)
        countdown = schedule_next_run(int(notification_id), result, context)
        if countdown is None:
            return "deferred"
    except (OperationalError, InterfaceError) as error:
        raise _store_unavailable(self, f"notification {notification_id}", error) from None
    raise self.retry(countdown=countdown, max_retries=None)


@app.task(name=SWEEP_TASK, ignore_result=True)
def sweep() -> int:
    """Publish outbox rows, due scheduled rows, finished long waits and rows whose task was lost."""
    context = runtime.send_context()
    # Batches for up to most of the beat interval: a backlog drains within a few sweeps.
    return run_sweep(sessions=context.sessions, enqueuer=runtime.enqueuer(), stale_after_s=context.settings.stale_after_s,
                     budget_s=0.8 * context.settings.sweep_interval_s)


@app.task(name=OUTCOME_TASK, bind=True, ignore_result=True, max_retries=None)
def outcome(self: Task, delivery_row_id: int) -> str:
    """Apply one recorded webhook delivery (at least once; (message, status) applies once).

    A limiter wait is retried after the wait; every run counts a try on the delivery, which is
    set aside past ``delivery_max_tries``, so this cannot loop forever."""
    try:
        workspace = runtime.workspace_of("webhook_deliveries", int(delivery_row_id))
        if not runtime.serves(workspace):
            log.error("webhook delivery %s: its workspace is not configured; not applied", delivery_row_id)
            return "skipped"
        context = runtime.send_context(workspace)
        return process_delivery(int(delivery_row_id), context, runtime.enqueuer())
    except Wait as wait:
        raise self.retry(countdown=max(wait.delay_s, 0.05), max_retries=None) from None
    except (OperationalError, InterfaceError) as error:
        raise _store_unavailable(self, f"webhook delivery {delivery_row_id}", error) from None


@app.task(name=OUTCOMES_TASK, bind=True, ignore_result=True, max_retries=None)
def outcomes(self: Task, delivery_row_ids: list[int]) -> dict[str, int]:
    """Apply several recorded webhook deliveries (the receiver's group commit), those with a status
    in one transaction (docs/tracking.md). Those told to wait (no status yet, or the limiter) run
    again after the wait, as one task; every run counts a try on each, as for ``outcome``."""
    row_ids = [int(row_id) for row_id in delivery_row_ids]
    try:
        by_workspace: dict[str, list[int]] = {}
        for row_id in row_ids:  # one workspace unless several are configured (then one read each)
            by_workspace.setdefault(runtime.workspace_of("webhook_deliveries", row_id), []).append(row_id)
        words: dict[str, int] = {}
        waiting: list[int] = []
        wait_s = 0.0
        for workspace, ids in by_workspace.items():
            if not runtime.serves(workspace):
                log.error("webhook deliveries %s: their workspace is not configured; not applied", ids)
                continue
            result = process_deliveries(ids, runtime.send_context(workspace), runtime.enqueuer())
            for word, count in result.words.items():
                words[word] = words.get(word, 0) + count
            waiting += result.waiting
            wait_s = max(wait_s, result.wait_s)
    except (OperationalError, InterfaceError) as error:
        raise _store_unavailable(self, f"webhook deliveries {row_ids}", error) from None
    if waiting:
        raise self.retry(args=[waiting], countdown=max(wait_s, 0.05), max_retries=None)
    return words


@app.task(name=RECORD_TASK, bind=True, ignore_result=True, max_retries=None)
def record_delivery(self: Task, delivery: dict[str, object]) -> str:
    """Record and apply a verified delivery the receiver could not record (its store was away).
    Retried within seconds while the store is away (bounded, as every task here), after a wait."""
    new = NewDelivery.from_task_argument(delivery)
    try:
        if not runtime.serves(new.workspace):
            log.error("webhook delivery %s: its workspace is not configured; not applied", new.delivery_id)
            return "skipped"
        return record_and_process(new, runtime.send_context(new.workspace), runtime.enqueuer())
    except Wait as wait:
        raise self.retry(countdown=max(wait.delay_s, 0.05), max_retries=None) from None
    except (OperationalError, InterfaceError) as error:
        raise _store_unavailable(self, f"webhook delivery {new.delivery_id}", error) from None


@app.task(name=READ_BACK_TASK, bind=True, ignore_result=True, max_retries=None)
def read_back(self: Task, message_id: int) -> str:
    """Read one message's state back: its report came while the store was away (a receiver from
    before issue 44 asks so; today's hands the delivery over whole, ``record_delivery``)."""
    try:
        return read_back_message(int(message_id), runtime.send_context(), runtime.enqueuer())
    except Wait as wait:  # bounded: the scheduled read-back still comes if the limiter never frees a slot
        raise self.retry(countdown=max(wait.delay_s, 0.05), max_retries=STORE_RETRY_BUDGET) from None
    except (OperationalError, InterfaceError) as error:
        raise _store_unavailable(self, f"read-back of message {message_id}", error) from None


@app.task(name=TRACKING_SWEEP_TASK, ignore_result=True)
def track() -> dict[str, object]:
    """Republish lost deliveries, reconcile unconfirmed attempts, decide on missed deadlines."""
    totals: dict[str, object] = {}
    for context in runtime.contexts():  # each workspace through its own API, limiter and rows
        report = tracking_sweep(context, runtime.enqueuer(), runtime.enqueuer().enqueue_outcome,
                                outcomes_waiting=runtime.enqueuer().outcome_queue_depth)
        totals[context.settings.workspace_name] = {
            "republished": report.republished, "reconciled": report.reconciled,
            "deadlines": report.deadline_decisions, "repaired": report.repaired}
    return totals


@app.task(name=RETENTION_TASK, ignore_result=True)
def retain() -> dict[str, int]:
    """Delete settled notifications (and their attempts) and webhook records older than the retention
    period; their event IDs stay spent (docs/notifications.md)."""
    context = runtime.send_context()
    report = purge(context.sessions, retention_days=context.settings.retention_days, now=context.clock(),
                   hashing_key=context.settings.hashing_key, spent_days=context.settings.event_id_spent_days)
    return vars(report)


@app.task(name=CALLBACKS_TASK, ignore_result=True)
def deliver_callbacks() -> dict[str, int]:
    """Deliver the host's due outcome callbacks, one batch (docs/callbacks.md)."""
    context = runtime.send_context()
    report = deliver_due(context.sessions, context.settings, runtime.callback_client(), clock=context.clock)
    return vars(report)
