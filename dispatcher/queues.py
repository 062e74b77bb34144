"""Task names, queue names and broker options: the agreement between producers and workers.

Both the producer in :mod:`dispatcher.enqueue` and the Celery app in ``workers/`` read these,
so a host that only enqueues never imports the workers.
"""

from __future__ import annotations

from typing import Any

SEND_QUEUE = "dispatcher.send"
OUTCOMES_QUEUE = "dispatcher.outcomes"
MAINTENANCE_QUEUE = "dispatcher.maintenance"

SEND_TASK = "dispatcher.send"
SWEEP_TASK = "dispatcher.sweep"

# Longer than any task can run (HTTP timeouts x retries inside one run stay far below it), so a
# Redis broker redelivers a task only when its worker really died.
DEFAULT_VISIBILITY_TIMEOUT_S = 3600


def broker_transport_options(broker_url: str, *, visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S) -> dict[str, Any]:
    options: dict[str, Any] = {"visibility_timeout": visibility_timeout_s}
    if broker_url.startswith("sqla+"):
        options["polling_interval"] = 0.2  # the SQL transport polls; default 1 s adds a second per hop
    return options
