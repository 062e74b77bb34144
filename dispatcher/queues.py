"""Task names, queue names and broker options: the agreement between producers and workers.

Both the producer in :mod:`dispatcher.enqueue` and the Celery app in ``workers/`` read these,
so a host that only enqueues never imports the workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SEND_QUEUE = "dispatcher.send"
OUTCOMES_QUEUE = "dispatcher.outcomes"
MAINTENANCE_QUEUE = "dispatcher.maintenance"

SEND_TASK = "dispatcher.send"
SWEEP_TASK = "dispatcher.sweep"
OUTCOME_TASK = "dispatcher.outcome"  # one verified webhook delivery, by its row ID
# one message whose delivery report the receiver could not record (its store was away), by its
# message ID: read its state back from the workspace once the store answers again
READ_BACK_TASK = "dispatcher.read_back"
TRACKING_SWEEP_TASK = "dispatcher.tracking_sweep"  # deadlines, reconciliation, unprocessed deliveries
RETENTION_TASK = "dispatcher.retention"  # delete per-send records past the retention period

# Longer than any task can run (HTTP timeouts x retries inside one run stay far below it), so a
# Redis broker redelivers a task only when its worker really died.
DEFAULT_VISIBILITY_TIMEOUT_S = 3600


EMBEDDED_TRANSPORT = "dispatcher.embedded_broker:Transport"


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
    return {"visibility_timeout": visibility_timeout_s}
