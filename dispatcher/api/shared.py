"""One WorkspaceClient per process, so every caller shares one connection pool.

``shared_client(settings)`` keys the instance by the settings values that shape a client
(URL, account, a digest of the token, timeouts in seconds, pool size), so rotated settings
get a fresh client. After ``fork()`` (Celery prefork workers) the child never reuses the
parent's pooled sockets: the cache is keyed by ``os.getpid()`` and a child starts empty. The
parent's clients are abandoned in the child, not closed, because closing a TLS socket there
could disturb the parent's connection.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from dispatcher.api.client import WorkspaceClient

__all__ = ["close_shared_clients", "shared_client"]

_lock = threading.Lock()
_pid: int | None = None
_clients: dict[tuple[Any, ...], WorkspaceClient] = {}


def _key(settings: Any) -> tuple[Any, ...]:
    token = settings.api_token
    raw = token.get_secret_value() if hasattr(token, "get_secret_value") else str(token)
    return (str(settings.api_url), int(settings.account_id),
            hashlib.sha256(raw.encode()).hexdigest(),
            float(settings.http_connect_timeout_s), float(settings.http_read_timeout_s),
            float(settings.http_write_timeout_s), float(settings.http_pool_timeout_s),
            int(settings.http_max_connections))


def shared_client(settings: Any) -> WorkspaceClient:
    """The process's client for these settings; created on first use, recreated after fork."""
    global _pid
    key = _key(settings)
    with _lock:
        if _pid != os.getpid():
            _clients.clear()  # inherited from the parent: abandon, do not close
            _pid = os.getpid()
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = WorkspaceClient.from_settings(settings)
        return client


def close_shared_clients() -> None:
    """Close and forget this process's shared clients (worker shutdown, tests)."""
    with _lock:
        clients = list(_clients.values()) if _pid == os.getpid() else []
        _clients.clear()
    for client in clients:
        client.close()
