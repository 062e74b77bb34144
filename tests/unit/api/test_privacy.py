"""No token, phone, e-mail or content in logs, exception texts or reprs, whatever fails."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

import httpx
import pytest

from dispatcher.api import ApiError, WorkspaceClient, find_contact_exact

TOKEN = "tok-PRIVACY-0a1b2c3d4e5f"
PHONE = "+15557654321"
EMAIL = "patient.zero@example.org"
CONTENT = "Oncology follow-up on Tuesday"
SECRETS = (TOKEN, PHONE, PHONE.lstrip("+"), "%2B15557654321", EMAIL, CONTENT)

# Every way a call can fail; each error body echoes the private values back, as services do.
ECHO = f'{{"error": "bad {PHONE} {EMAIL} {CONTENT} {TOKEN}"}}'.encode()


def _status(code: int, **headers: str) -> Callable[[httpx.Request], httpx.Response]:
    return lambda r: httpx.Response(code, content=ECHO, headers=headers)


def _raise(exc: type[httpx.TransportError]) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        raise exc(f"failed for {request.url} token={TOKEN}", request=request)
    return answer


FAILURES = [_status(s) for s in (400, 401, 403, 404, 422, 500, 502, 503)] + [
    _status(429, **{"content-type": "text/plain"}),
    _status(429, **{"retry-after": "3"}),
    lambda r: httpx.Response(200, content=ECHO[:-3]),  # truncated JSON
    lambda r: httpx.Response(200, json={"payload": {"content": CONTENT, "phone_number": PHONE}}),
    lambda r: httpx.Response(200, json={"id": f"n/a {PHONE}", "content": CONTENT}),
    lambda r: httpx.Response(302, headers={"location": f"https://evil.example/?t={TOKEN}"}),
] + [_raise(exc) for exc in (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout,
                              httpx.WriteTimeout, httpx.PoolTimeout, httpx.ReadError, httpx.WriteError,
                              httpx.RemoteProtocolError, httpx.LocalProtocolError, httpx.ProxyError,
                              httpx.CloseError, httpx.UnsupportedProtocol)]

CALLS: list[Callable[[WorkspaceClient], object]] = [
    lambda c: c.search_contacts(PHONE),
    lambda c: c.search_contacts(EMAIL),
    lambda c: c.create_contact(inbox_id=3, name="Zero", phone_number=PHONE, email=EMAIL, identifier="p-1"),
    lambda c: c.create_conversation(source_id=PHONE.lstrip("+"), inbox_id=3, contact_id=11),
    lambda c: c.create_message(42, content=CONTENT),
    lambda c: c.create_message(42, content=CONTENT, template_params={
        "name": "reminder", "category": "UTILITY", "language": "en",
        "processed_params": {"body": {"1": CONTENT}}}),
    lambda c: c.list_messages(42),
    lambda c: find_contact_exact(c, identifier="p-1", phone_number=PHONE),
    lambda c: c.create_webhook(url=f"https://hooks.example/in?token={TOKEN}", subscriptions=["message_updated"]),
]


def test_nothing_private_leaks_from_any_failure(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    failures = 0
    for answer in FAILURES:
        client = WorkspaceClient(base_url="https://workspace.example", account_id=7, api_token=TOKEN,
                                 transport=httpx.MockTransport(answer))
        texts += [repr(client), str(client)]
        for call in CALLS:
            try:
                call(client)
            except ApiError as error:
                failures += 1
                texts += [str(error), repr(error), "".join(traceback.format_exception(error)),
                          repr(vars(error))]
        client.close()
    assert failures == len(FAILURES) * len(CALLS)  # every call failed: the test saw every path
    assert caplog.records, "DEBUG logging captured nothing: the log check would prove nothing"
    logged = [caplog.text] + [r.getMessage() for r in caplog.records]
    for secret in SECRETS:
        for text in texts + logged:
            assert secret not in text
    assert not any(r.name.startswith(("httpx", "httpcore")) for r in caplog.records)
