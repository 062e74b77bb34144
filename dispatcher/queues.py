"""Task names, queue names and broker options: the agreement between producers and workers.

Both the producer in :mod:`dispatcher.enqueue` and the Celery app in ``workers/`` read these,
so a host that only enqueues never imports the workers.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any

# The default workspace's normal sends: the name it always had, so tasks queued before lanes came
# are still consumed after an upgrade.
SEND_QUEUE = "dispatcher.send"
# Urgent sends have lanes of their own (docs/priorities.md). A workspace name holds no dot, so no
# workspace's queue can be named like a lane.
URGENT_QUEUE = "dispatcher.urgent"
OUTCOMES_QUEUE = "dispatcher.outcomes"
MAINTENANCE_QUEUE = "dispatcher.maintenance"

SEND_TASK = "dispatcher.send"
SWEEP_TASK = "dispatcher.sweep"
OUTCOME_TASK = "dispatcher.outcome"  # one verified webhook delivery, by its row ID
# several verified deliveries, by their row IDs (the receiver's group commit): applied together
OUTCOMES_TASK = "dispatcher.outcomes"
OUTCOMES_PER_TASK = 100  # at most, so that one task stays short (a batch is one transaction)
# one message whose delivery report the receiver could not record (its store was away), by its
# message ID: read its state back from the workspace once the store answers again. Published by
# receivers before issue 44 only (a rolling upgrade may still hold some); kept so they are run.
READ_BACK_TASK = "dispatcher.read_back"
# one verified delivery the receiver could not record (its store was away), whole: its summary
# (IDs, status, error code, the body's keyed hash; never content), recorded and applied by the
# consumer once the store answers. A read-back cannot replace it: a status a late callback
# overwrote is in the delivery, not in the message list any more.
RECORD_TASK = "dispatcher.record_delivery"
TRACKING_SWEEP_TASK = "dispatcher.tracking_sweep"  # deadlines, reconciliation, unprocessed deliveries
RETENTION_TASK = "dispatcher.retention"  # delete per-send records past the retention period
CALLBACKS_TASK = "dispatcher.callbacks"  # deliver the host's due outcome callbacks

# A Redis broker has no connection-bound delivery: a task a worker took stays in the "unacked"
# hash until it is acknowledged, and any worker's restore sweep puts it back in its queue once it is
# older than the visibility timeout (kombu.transport.redis QoS.restore_visible). So the work a
# worker held when it was SIGKILLed whole (running, prefetched, countdown retries in memory) comes
# back after visibility timeout + one restore period: 30 + 5 s, within the 60 s promised for a lost
# worker (issue 22), with time left for the run itself. (RabbitMQ needs none of this: a dead
# worker's connection closes and the broker requeues its unacknowledged deliveries at once.)
# The price: a task unacknowledged for longer than this while its worker lives (a run stuck on
# HTTP timeouts, a countdown longer than it) is delivered a second time. A twin run is harmless
# (every move is a compare-and-set; createMessage waits for the attempt's lease), but countdowns
# must stay well below it: Settings keeps retry_max_countdown_s + COUNTDOWN_MARGIN_S under it.
DEFAULT_VISIBILITY_TIMEOUT_S = 30
# How often each worker's event loop runs the restore sweep (kombu's default is every 10 s, and
# with its throttle of 10 only every 10th call scans: 100 s, past the bound on its own).
RESTORE_INTERVAL_S = 5
# A worker killed while it holds the restore sweep's lock (a Redis lock with this expiry) keeps
# every other worker from restoring until it expires: kombu's 300 s would break the bound. The
# sweep takes milliseconds, and two overlapping sweeps cannot restore one message twice (each
# restore is a WATCHed transaction on the unacked hash).
RESTORE_LOCK_EXPIRY_S = 10
# What a countdown task may spend unacknowledged beyond its countdown: the wait for a free pool
# process and the run itself.
COUNTDOWN_MARGIN_S = 10


class Priority(StrEnum):
    """A notification's lane: ``urgent`` (a one-time code, a same-day change) or ``normal``."""

    URGENT = "urgent"
    NORMAL = "normal"


DEFAULT_WORKSPACE_NAME = "default"  # dispatcher.settings.DEFAULT_WORKSPACE (settings imports this module)


def send_queue(workspace: str, priority: Priority) -> str:
    """The queue of a workspace's sends of one priority: each workspace and lane its own queue, so
    a backlog or an outage of one never stands in front of another's tasks. Every send worker
    consumes every send queue (``send_queues``), taking them in turn (docs/priorities.md)."""
    base = URGENT_QUEUE if priority is Priority.URGENT else SEND_QUEUE
    return base if workspace == DEFAULT_WORKSPACE_NAME else f"{base}.{workspace}"


def send_queues(workspaces: Iterable[str]) -> list[str]:
    """Every send queue of these workspaces (the default one always), urgent lanes first."""
    names = [DEFAULT_WORKSPACE_NAME, *sorted(set(workspaces) - {DEFAULT_WORKSPACE_NAME})]
    return [send_queue(name, priority) for priority in (Priority.URGENT, Priority.NORMAL) for name in names]


EMBEDDED_TRANSPORT = "dispatcher.embedded_broker:Transport"
REDIS_URL_PREFIXES = ("redis://", "rediss://", "redis+socket://", "sentinel://")
AMQP_URL_PREFIXES = ("amqp://", "amqps://", "pyamqp://")


def broker_transport(broker_url: str) -> str | None:
    """Celery's ``broker_transport`` for the URL: kombu's file transport made atomic, else the URL's own."""
    return EMBEDDED_TRANSPORT if broker_url.startswith("filesystem://") else None


def broker_transport_options(broker_url: str, *, visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S) -> dict[str, Any]:
    """Transport options for the broker URL's kind.

    Kombu's SQLAlchemy transport hands every transport option to ``create_engine``, which refuses
    unknown ones, and it has no visibility timeout (a message is taken in a row lock): it gets none.
    """
    if broker_url.startswith("sqla+"):
        return {}
    if broker_url.startswith("filesystem://"):
        # One file a message in a folder (dispatcher.embedded_broker), taken by a rename.
        folder = broker_url.removeprefix("filesystem://").lstrip("/") or "var/broker"
        if broker_url.startswith("filesystem:///"):
            folder = "/" + folder
        Path(folder).mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "control_folder": f"{folder}/control",  # fanout (events, remote control); default: ./control
            "store_processed": False,
            "polling_interval": 0.1,
        }
    if broker_url.startswith(REDIS_URL_PREFIXES):
        return {
            "visibility_timeout": visibility_timeout_s,
            "unacked_restore_interval": RESTORE_INTERVAL_S,
            "unacked_restore_throttle": 1,  # every call of the sweep scans (kombu's default: every 10th)
            "unacked_mutex_expire": RESTORE_LOCK_EXPIRY_S,
        }
    if broker_url.startswith(AMQP_URL_PREFIXES):
        # RabbitMQ requeues a dead consumer's deliveries when its connection drops, so the Redis
        # options above mean nothing there. But without publisher confirms a publish returns
        # before the node has written the message, and a persistent message handed straight to a
        # waiting consumer is not on disk yet: a node crash then loses it, although a worker had
        # received it (issue 20's CI run lost a send task so; a node killed right after a burst of 50
        # gave back none of them without confirms, all 50 with: tests/integration/test_rabbitmq_node.py). With
        # confirms every publish waits for the node's ack, given once the message is on disk, and a
        # crash before it makes the publish raise: the relay then leaves the rows to the next sweep
        # instead of to stale_after_s. Cost: a round trip a publish, 9 % fewer warm sends a second
        # (docs/benchmarks.md, "Publisher confirms").
        return {"confirm_publish": True}
    # Kept as before for any other kind (SQS has a visibility timeout of its own).
    return {"visibility_timeout": visibility_timeout_s}


def has_visibility_timeout(broker_url: str) -> bool:
    """True for a Redis broker, where an unacknowledged task comes back after the visibility timeout."""
    return broker_url.startswith(REDIS_URL_PREFIXES)
