"""Injected faults per operationId: latency, 5xx, 429, timeouts, and "commit, then drop the response".

The last one is the case the dispatcher must survive without a duplicate: the message is stored and
proceeds as normal, but the caller never hears so. ``drop_mode = "close"`` closes the connection
before a single response byte is written, so the client sees a transport error (httpx:
``RemoteProtocolError: Server disconnected without sending a response``), never a 5xx.

How "close" works: ASGI has no "abort" message, so :class:`DroppedResponse` starts a response with a
header name that is illegal in HTTP. uvicorn marks the response started, refuses to serialise it
(nothing reaches the socket) and, as the application then raises, closes the transport instead of
answering 500. ``tests/integration/sandbox`` checks this against the installed uvicorn, and
:class:`QuietDroppedResponses` keeps the resulting traceback out of the logs.
``drop_mode = "hang"`` is the portable alternative: hold the answer ``hang_s`` seconds so the client
times out first.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Literal

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sandbox.config import Fault, validate_faults

Draw = Literal["pass", "timeout", "rate_limit", "server_error", "drop"]


class ResponseDropped(Exception):
    """Raised on purpose so the server closes the connection without answering."""


class DroppedResponse(Response):
    def __init__(self) -> None:
        super().__init__(status_code=200)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x sandbox dropped", b"1")]})
        except Exception as exc:  # the expected path: the server refused the illegal header
            raise ResponseDropped("response dropped on purpose") from exc
        raise ResponseDropped("response dropped on purpose")


class QuietDroppedResponses(logging.Filter):
    """Drop uvicorn's "Exception in ASGI application" record for a deliberate drop."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, ResponseDropped)


class FaultTable:
    """The current fault settings; replaced whole by ``PUT /_sandbox/faults``."""

    def __init__(self, initial: dict[str, Fault], *, seed: int) -> None:
        self.initial = dict(initial)
        self.current = dict(initial)
        # Its own random stream: adding webhooks or contacts does not change which calls fail.
        self.rng = random.Random(seed + 1)
        self.seed = seed

    def reset(self) -> None:
        self.current = dict(self.initial)
        self.rng = random.Random(self.seed + 1)

    def replace(self, raw: dict[str, Any]) -> None:
        self.current = validate_faults(raw)

    def get(self, operation_id: str) -> Fault | None:
        return self.current.get(operation_id)

    def snapshot(self) -> dict[str, Any]:
        return {op: fault.model_dump() for op, fault in self.current.items()}

    def draw(self, fault: Fault) -> Draw:
        """One draw decides the outcome; shares are stacked in the order timeout, 429, 5xx, drop."""
        roll = self.rng.random()
        for share, outcome in (
            (fault.timeout_share, "timeout"),
            (fault.rate_limit_share, "rate_limit"),
            (fault.server_error_share, "server_error"),
            (fault.drop_response_share, "drop"),
        ):
            if roll < share:
                return outcome  # type: ignore[return-value]
            roll -= share
        return "pass"
