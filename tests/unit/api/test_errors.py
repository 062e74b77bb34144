"""The error tree and the one mapping from httpx failures and responses onto it."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api import errors as api_errors
from dispatcher.api.errors import (
    READ_OPERATIONS,
    WRITE_OPERATIONS,
    AccessDenied,
    ApiError,
    ApiStatusError,
    Forbidden,
    NotFound,
    NotSent,
    OutcomeUnknown,
    RateLimited,
    Rejected,
    ServerError,
    Unauthorized,
    UnexpectedResponse,
    error_for_status,
    map_errors,
    parse_retry_after_s,
)
from dispatcher.errors import DispatcherError

from .conftest import CALLS, WRITES, raising, reply

# The contract's "Errors" table, verbatim, plus the field notes' 422 on a duplicate contact.
CONTRACT_STATUSES: dict[str, tuple[int, ...]] = {
    "listInboxes": (401, 403),
    "searchContacts": (401,),
    "createContact": (400, 401, 422),
    "listContactableInboxes": (401, 422),
    "listConversations": (401,),
    "createConversation": (400, 403),
    "listMessages": (401, 404),
    "createMessage": (403, 404),
    "listWebhooks": (401,),
    "createWebhook": (401,),
}
EXPECTED_CLASS = {400: Rejected, 401: Unauthorized, 403: Forbidden, 404: NotFound, 422: Rejected}
ERROR_BODY = {"error": "Invalid Access Token for +15550009999"}


def test_operations_cover_the_ten_contract_operations() -> None:
    assert READ_OPERATIONS | WRITE_OPERATIONS == set(CALLS) == set(CONTRACT_STATUSES)
    assert WRITE_OPERATIONS == WRITES
    assert not READ_OPERATIONS & WRITE_OPERATIONS


def test_tree_shape() -> None:
    assert issubclass(ApiError, DispatcherError)
    for cls in (NotSent, OutcomeUnknown, ApiStatusError, UnexpectedResponse):
        assert cls.__bases__ == (ApiError,)
    for cls in (RateLimited, ServerError, AccessDenied, NotFound, Rejected):
        assert cls.__bases__ == (ApiStatusError,)
    assert Unauthorized.__bases__ == Forbidden.__bases__ == (AccessDenied,)


@pytest.mark.parametrize(("operation", "status"),
                         [(op, s) for op, statuses in CONTRACT_STATUSES.items() for s in statuses])
def test_contract_status_table(make_client, operation: str, status: int) -> None:
    # given the service answers the documented error status with a JSON error body
    client, _ = make_client(reply(status, ERROR_BODY))
    # when the operation is called
    with pytest.raises(ApiError) as info:
        CALLS[operation](client)
    # then the error is the one class for that status, final, unambiguous, body-free
    error = info.value
    assert type(error) is EXPECTED_CLASS[status]
    assert error.status_code == status
    assert error.operation == operation
    assert error.retryable is False
    assert error.ambiguous is False
    assert f"HTTP {status}" in str(error) and operation in str(error)
    assert "Invalid Access Token" not in str(error) + repr(error)
    assert error.__cause__ is None and error.__suppress_context__


@pytest.mark.parametrize("operation", sorted(CALLS))
@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_errors_are_retryable_and_ambiguous_on_writes(make_client, operation: str,
                                                             status: int) -> None:
    client, _ = make_client(reply(status, content=b"<html>upstream down</html>"))
    with pytest.raises(ServerError) as info:
        CALLS[operation](client)
    assert info.value.status_code == status
    assert info.value.retryable is True
    assert info.value.ambiguous is (operation in WRITES)
    assert "upstream" not in str(info.value)


def test_rate_limited_text_plain_without_retry_after(make_client) -> None:
    # the field notes: 429, text/plain "Retry later", no Retry-After
    client, _ = make_client(reply(429, content=b"Retry later", headers={"content-type": "text/plain"}))
    with pytest.raises(RateLimited) as info:
        client.search_contacts("+15551234567")
    assert info.value.retry_after_s is None
    assert info.value.retryable is True and info.value.ambiguous is False
    assert info.value.status_code == 429
    assert "Retry later" not in str(info.value)


def test_rate_limited_retry_after_seconds(make_client) -> None:
    client, _ = make_client(reply(429, {"error": "x"}, headers={"retry-after": "7"}))
    with pytest.raises(RateLimited) as info:
        client.create_message(1, content="hello")
    assert info.value.retry_after_s == 7.0
    assert info.value.ambiguous is False  # a 429 was refused before the application ran


def test_rate_limited_retry_after_http_date_uses_the_service_clock(make_client) -> None:
    headers = {"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT", "date": "Wed, 21 Oct 2015 07:28:00 GMT"}
    client, _ = make_client(reply(429, content=b"Retry later", headers=headers))
    with pytest.raises(RateLimited) as info:
        client.list_inboxes()
    assert info.value.retry_after_s == 30.0


def test_service_unavailable_carries_retry_after(make_client) -> None:
    client, _ = make_client(reply(503, content=b"", headers={"retry-after": "120"}))
    with pytest.raises(ServerError) as info:
        client.list_inboxes()
    assert info.value.retry_after_s == 120.0


NOW = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC)


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("", None), ("  ", None), ("soon", None), ("nan", None), ("inf", None),
    ("0", 0.0), ("7", 7.0), (" 12 ", 12.0), ("1.5", 1.5), ("-3", 0.0),
    ("Wed, 21 Oct 2015 07:29:00 GMT", 60.0),
    ("Wed, 21 Oct 2015 07:00:00 GMT", 0.0),  # in the past: go now
    ("Wednesday, 21-Oct-15 07:28:10 GMT", 10.0),  # obsolete RFC 850 form
])
def test_parse_retry_after_s(value: str | None, expected: float | None) -> None:
    assert parse_retry_after_s(value, now=NOW) == expected


@pytest.mark.parametrize("status", [301, 302, 304, 405, 409, 413, 418])
def test_statuses_outside_the_table_are_final_plain_status_errors(make_client, status: int) -> None:
    client, recorder = make_client(reply(status, {}, headers={"location": "https://elsewhere.example/"}))
    with pytest.raises(ApiStatusError) as info:
        client.list_inboxes()
    assert type(info.value) is ApiStatusError
    assert info.value.retryable is False and info.value.status_code == status
    assert len(recorder.requests) == 1  # redirects are not followed: the token stays home


UNREADABLE = [
    pytest.param(b"Retry later", {"content-type": "text/plain"}, id="text-plain"),
    pytest.param(b"", {}, id="empty"),
    pytest.param(b'{"id": 1, "content": "+15550009999', {}, id="truncated-json"),
    pytest.param(b"\xff\xfe\x00garbage", {}, id="not-utf8"),
    pytest.param(b'"just a string +15550009999"', {}, id="wrong-type"),
    pytest.param(b'{"payload": {"content": "+15550009999"}}', {}, id="missing-id"),
    pytest.param(b'{"id": "not-a-number-+15550009999"}', {}, id="bad-id"),
    pytest.param(b"definitely not gzip", {"content-encoding": "gzip"}, id="bad-gzip"),
]


@pytest.mark.parametrize(("content", "headers"), UNREADABLE)
@pytest.mark.parametrize("operation", ["createMessage", "createConversation", "listMessages",
                                       "listInboxes", "searchContacts", "createWebhook"])
def test_unreadable_success_bodies(make_client, operation: str, content: bytes,
                                   headers: dict[str, str]) -> None:
    client, _ = make_client(reply(200, content=content, headers=headers))
    with pytest.raises(UnexpectedResponse) as info:
        CALLS[operation](client)
    error = info.value
    assert error.retryable is False
    assert error.ambiguous is (operation in WRITES)  # a 200 write took effect
    # a body that cannot even be decompressed never yields a response object
    assert error.status_code == (None if headers.get("content-encoding") else 200)
    assert "+1555" not in str(error) + repr(error)
    assert error.__cause__ is None and error.__suppress_context__


def _transport_classes() -> set[type[httpx.TransportError]]:
    found: set[type[httpx.TransportError]] = set()
    todo = [httpx.TransportError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("httpx") and cls not in found:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return found


NEVER_LEFT = {httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError,
              httpx.UnsupportedProtocol}
MAYBE_ARRIVED = {httpx.TransportError, httpx.TimeoutException, httpx.NetworkError,
                 httpx.ProtocolError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.ReadError,
                 httpx.WriteError, httpx.CloseError, httpx.RemoteProtocolError,
                 httpx.LocalProtocolError}


def test_every_httpx_transport_error_is_classified() -> None:
    # a new httpx class fails here until someone decides where it belongs
    assert _transport_classes() == NEVER_LEFT | MAYBE_ARRIVED
    assert not NEVER_LEFT & MAYBE_ARRIVED


@pytest.mark.parametrize("exc_type", sorted(NEVER_LEFT | MAYBE_ARRIVED, key=lambda c: c.__name__))
@pytest.mark.parametrize("operation", sorted(CALLS))
def test_transport_failures(make_client, operation: str,
                            exc_type: type[httpx.TransportError]) -> None:
    client, _ = make_client(raising(exc_type))
    with pytest.raises(ApiError) as info:
        CALLS[operation](client)
    error = info.value
    if operation in WRITES and exc_type in MAYBE_ARRIVED:
        assert type(error) is OutcomeUnknown
        assert error.ambiguous is True
        assert "check before resending" in str(error)
    else:
        assert type(error) is NotSent
        assert error.ambiguous is False
    assert error.retryable is True
    assert error.detail == exc_type.__name__
    assert error.__cause__ is None and error.__suppress_context__


@settings(database=None)
@given(status=st.integers(min_value=100, max_value=599).filter(lambda s: not 200 <= s <= 299),
       operation=st.sampled_from(sorted(READ_OPERATIONS | WRITE_OPERATIONS)),
       retry_after=st.one_of(st.none(), st.text(max_size=40)))
def test_any_status_maps_to_exactly_one_class_with_a_consistent_flag(
        status: int, operation: str, retry_after: str | None) -> None:
    headers = {} if retry_after is None or not retry_after.isascii() else {"retry-after": retry_after}
    response = httpx.Response(status, headers=headers, request=httpx.Request("GET", "https://x/"))
    error = error_for_status(operation, response)
    expected = {400: Rejected, 401: Unauthorized, 403: Forbidden, 404: NotFound, 422: Rejected,
                429: RateLimited}.get(status, ServerError if status >= 500 else ApiStatusError)
    assert type(error) is expected
    assert error.retryable is (status == 429 or status >= 500)
    assert error.ambiguous is (status >= 500 and operation in WRITE_OPERATIONS)
    assert error.retryable is type(error).retryable


def test_message_names_operation_status_and_our_ids_only() -> None:
    error = NotFound("listMessages", status_code=404, context={"conversation_id": 42})
    error.context["notification_id"] = "n-1"  # callers may add their own IDs
    assert str(error) == "listMessages: HTTP 404 (final) [conversation_id=42, notification_id=n-1]"
    assert repr(error).startswith("NotFound(") and "conversation_id=42" in repr(error)


def test_errors_survive_pickling() -> None:
    original = RateLimited("searchContacts", context={"inbox_id": 3}, retry_after_s=2.5)
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is RateLimited
    assert (copy.retry_after_s, copy.status_code, copy.context, str(copy)) == \
        (2.5, 429, {"inbox_id": 3}, str(original))
    unknown = pickle.loads(pickle.dumps(OutcomeUnknown("createMessage", detail="ReadTimeout")))
    assert unknown.ambiguous is True and unknown.detail == "ReadTimeout"


def test_map_errors_refuses_an_unknown_operation() -> None:
    with pytest.raises(ValueError, match="unknown operation"), map_errors("sendFax"):
        pass  # pragma: no cover


def test_map_errors_lets_other_exceptions_through() -> None:
    with pytest.raises(KeyError), map_errors("listInboxes"):
        raise KeyError("not ours")


def test_module_exports_exist() -> None:
    assert all(hasattr(api_errors, name) for name in api_errors.__all__)
