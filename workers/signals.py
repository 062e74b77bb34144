"""Cross-cutting hooks of the worker processes."""

from __future__ import annotations

import logging

from celery.signals import worker_process_init

from dispatcher.api.client import quiet_http_logging
from dispatcher.db import dispose_after_fork


@worker_process_init.connect
def _after_fork(**_: object) -> None:
    # Pooled database connections inherited from the parent must not be shared with it.
    dispose_after_fork()
    quiet_http_logging()
    logging.getLogger("dispatcher").setLevel(logging.INFO)
