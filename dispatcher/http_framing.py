"""Refuse a request whose length is framed twice: both ``Transfer-Encoding`` and ``Content-Length``.

RFC 9112 §6.1 says such a message may be an attempt at request smuggling: a proxy in front of
us and our server could read different bodies out of the same bytes. uvicorn passes it through,
so every app of ours that reads a body (the webhook receiver, the HTTP intake) is wrapped in
this ASGI middleware, which answers 400 before the app sees the request.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

REFUSAL = b'{"error":"malformed_request","field":"transfer-encoding","detail":"sent with content-length"}'


class RefuseDoubleFraming:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"transfer-encoding" in names and b"content-length" in names:
                await send({"type": "http.response.start", "status": 400,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": REFUSAL})
                return
        await self.app(scope, receive, send)
