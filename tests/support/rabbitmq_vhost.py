"""A RabbitMQ virtual host of a test's own on the machine's RabbitMQ (127.0.0.1:5672, guest),
deleted with everything in it: the machine's RabbitMQ is shared, so a test never touches a vhost
it did not make. ``rabbitmqctl`` does the work (scripts/test starts RabbitMQ when it does not answer)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

RABBITMQ_HOST, RABBITMQ_PORT = "127.0.0.1", 5672


def rabbitmqctl(*arguments: str) -> None:
    """Run one ``rabbitmqctl`` command; RuntimeError (one line, no output beyond its error) when it fails."""
    try:
        done = subprocess.run(["rabbitmqctl", "-q", *arguments], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"rabbitmqctl {arguments[0]} did not run: {type(error).__name__}") from None
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {arguments[0]} failed (is RabbitMQ running on "
                           f"{RABBITMQ_HOST}:{RABBITMQ_PORT}?): {done.stderr.strip()[:200]}")


@contextmanager
def private_vhost(prefix: str) -> Iterator[str]:
    """A new vhost named ``<prefix>-<random>`` that guest may use; its name. Deleted on the way out."""
    vhost = f"{prefix}-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield vhost
    finally:
        rabbitmqctl("delete_vhost", vhost)
