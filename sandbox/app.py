"""The sandbox ASGI application: ``create_app(config)`` builds it, uvicorn serves it.

The sandbox is the other side of the contract. It imports nothing from ``dispatcher`` or ``workers``
(a unit test checks), so client and double cannot agree on a mistake.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sandbox import contract_routes, inspect_routes
from sandbox.config import SandboxConfig, load_config
from sandbox.faults import ResponseDropped
from sandbox.responses import json_error
from sandbox.runtime import Sandbox

log = logging.getLogger("sandbox")


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Unknown paths and wrong methods answer JSON too ("Error bodies are JSON objects")."""
    assert isinstance(exc, HTTPException)
    response = json_error(exc.status_code, "Not found" if exc.status_code == 404 else str(exc.detail))
    if exc.headers:  # e.g. Allow on 405
        response.headers.update(exc.headers)
    return response


async def _server_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ResponseDropped):  # a deliberate drop is not an error
        log.error("unexpected %s in %s", type(exc).__name__, request.url.path)
    return json_error(500, "Internal server error")


def create_app(config: SandboxConfig | None = None, *, sandbox: Sandbox | None = None) -> Starlette:
    """The app around ``sandbox``, or a fresh in-memory one on ``config`` (the default seed if None)."""
    if sandbox is None:
        sandbox = Sandbox(config or load_config())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await sandbox.webhooks.start()
        sandbox.resume()
        log.info("sandbox ready: %d accounts, %d inboxes", len(sandbox.store.accounts), len(sandbox.store.inboxes))
        try:
            yield
        finally:
            await sandbox.webhooks.stop()
            sandbox.close()  # here, not after uvicorn returns: on SIGTERM it re-raises the signal

    app = Starlette(
        routes=[*contract_routes.routes, *inspect_routes.routes],
        exception_handlers={HTTPException: _http_exception, Exception: _server_error},
        lifespan=lifespan,
    )
    app.state.sandbox = sandbox
    return app
