"""Errors of the workspace API client, named for what the caller does next.

::

    DispatcherError                       (dispatcher.errors)
      ApiError                            operation, context (our IDs), retryable, ambiguous
        NotSent                           retryable: the request never left, or it was a read
        OutcomeUnknown                    retryable, ambiguous: a write may have taken effect
        ApiStatusError                    status_code; final unless a subclass says otherwise
          RateLimited                     429, retryable; retry_after_s may be None
          ServerError                     5xx, retryable; ambiguous on a write
          AccessDenied                    401/403, final: stop and alert
            Unauthorized                  401
            Forbidden                     403
          NotFound                        404, final
          Rejected                        400/422, final: an invalid request
        UnexpectedResponse                a 2xx body we cannot read; final; ambiguous on a write

``retryable`` says a later attempt may succeed. ``ambiguous`` says the failed call may have
taken effect on the service (a message may already be on its way), so the caller must look
(read the conversation's messages) before it sends again. The API has no idempotency key, so
the client never retries anything itself: :func:`map_errors` only translates.

Decisions:

* Transport failures on a READ are :class:`NotSent` (retryable, not ambiguous) whatever the
  phase: a read has no effect a retry could duplicate. On a WRITE only failures that happen
  before a byte of the request can have reached the service (connect error or timeout, pool
  timeout, proxy tunnel refused, unsupported scheme) are :class:`NotSent`; every other
  transport failure, including unknown future ``httpx.TransportError`` subclasses, is
  :class:`OutcomeUnknown`.
* A 5xx on a write is ambiguous: a gateway timeout (502/504) or a crash after the insert can
  follow a write that took effect.
* Statuses outside the contract's table (3xx since redirects are not followed, 405, 409 ...)
  raise the plain :class:`ApiStatusError`, final.

Privacy: messages carry the operation, the status, the httpx failure class and the IDs in
``context``. Never response bodies, URLs (which hold the search query), phone numbers, e-mail
addresses, message content or the token. Foreign exceptions are raised ``from None`` because
their text can hold the URL; put only our own IDs into ``context``.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx
import pydantic

from dispatcher.errors import DispatcherError

__all__ = [
    "READ_OPERATIONS",
    "WRITE_OPERATIONS",
    "AccessDenied",
    "ApiError",
    "ApiStatusError",
    "Forbidden",
    "NotFound",
    "NotSent",
    "OutcomeUnknown",
    "RateLimited",
    "Rejected",
    "ServerError",
    "Unauthorized",
    "UnexpectedResponse",
    "error_for_status",
    "error_for_transport",
    "map_errors",
    "parse_retry_after_s",
]

WRITE_OPERATIONS = frozenset({"createContact", "createConversation", "createMessage", "createWebhook"})
READ_OPERATIONS = frozenset(
    {"listInboxes", "searchContacts", "listContactableInboxes", "listConversations",
     "listMessages", "listWebhooks"}
)

# Failures raised before any byte of the request can have reached the service.
_NEVER_LEFT: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,  # TCP or TLS set-up failed
    httpx.ConnectTimeout,
    httpx.PoolTimeout,  # waited for a free connection, never got one
    httpx.ProxyError,  # the proxy refused to open the tunnel
    httpx.UnsupportedProtocol,  # refused before connecting
)

Context = Mapping[str, int | str]


class ApiError(DispatcherError):
    """A workspace API call failed. ``context`` holds our IDs only; it may be extended."""

    retryable: bool = False

    def __init__(self, operation: str, *, context: Context | None = None,
                 ambiguous: bool = False, detail: str | None = None) -> None:
        super().__init__(operation)
        self.operation = operation
        self.context: dict[str, int | str] = dict(context or {})
        self.ambiguous = ambiguous
        self.detail = detail  # a short code such as "ReadTimeout"; never body text

    def _summary(self) -> str:
        return self.detail or "failed"

    def __str__(self) -> str:
        verdict = "retryable" if self.retryable else "final"
        if self.ambiguous:
            verdict += ", may have taken effect: check before resending"
        ids = ", ".join(f"{key}={value}" for key, value in self.context.items())
        return f"{self.operation}: {self._summary()} ({verdict})" + (f" [{ids}]" if ids else "")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only constructors do not pickle by default; keep the state instead.
        return (_rebuild, (type(self), self.__dict__.copy()))


def _rebuild(cls: type[ApiError], state: dict[str, Any]) -> ApiError:
    error = cls.__new__(cls)
    Exception.__init__(error, state.get("operation", ""))
    error.__dict__.update(state)
    return error


class NotSent(ApiError):
    """The call had no effect a retry could duplicate: it never left, or it was a read."""

    retryable = True


class OutcomeUnknown(ApiError):
    """A write failed in transit after it may have reached the service: look before resending."""

    retryable = True

    def __init__(self, operation: str, *, context: Context | None = None,
                 detail: str | None = None) -> None:
        super().__init__(operation, context=context, ambiguous=True, detail=detail)


class ApiStatusError(ApiError):
    """The service answered with an error status. The plain class covers statuses outside the
    contract's table (3xx, 405, 409 ...) and is final."""

    def __init__(self, operation: str, *, status_code: int, context: Context | None = None,
                 ambiguous: bool = False, detail: str | None = None) -> None:
        super().__init__(operation, context=context, ambiguous=ambiguous, detail=detail)
        self.status_code = status_code

    def _summary(self) -> str:
        return f"HTTP {self.status_code}" + (f" {self.detail}" if self.detail else "")


class RateLimited(ApiStatusError):
    """429. ``retry_after_s`` (seconds) comes from Retry-After; the service usually sends none."""

    retryable = True

    def __init__(self, operation: str, *, status_code: int = 429, context: Context | None = None,
                 retry_after_s: float | None = None, detail: str | None = None) -> None:
        super().__init__(operation, status_code=status_code, context=context, detail=detail)
        self.retry_after_s = retry_after_s


class ServerError(ApiStatusError):
    """5xx. Retryable; ``ambiguous`` on a write. ``retry_after_s`` is set when a 503 says so."""

    retryable = True

    def __init__(self, operation: str, *, status_code: int, context: Context | None = None,
                 retry_after_s: float | None = None, ambiguous: bool = False,
                 detail: str | None = None) -> None:
        super().__init__(operation, status_code=status_code, context=context,
                         ambiguous=ambiguous, detail=detail)
        self.retry_after_s = retry_after_s


class AccessDenied(ApiStatusError):
    """401 or 403: the token is wrong or lacks access. Final: stop sending and alert."""


class Unauthorized(AccessDenied):
    """401: missing or invalid token (the service also uses it for some permission failures)."""


class Forbidden(AccessDenied):
    """403: the token has no access to the account or resource."""


class NotFound(ApiStatusError):
    """404: the account-scoped resource does not exist. Final."""


class Rejected(ApiStatusError):
    """400 or 422: the service refused the request as invalid (422 also for a duplicate
    contact and for "too many messages" in one conversation). Final."""


class UnexpectedResponse(ApiError):
    """A success status whose body we cannot read. Final; ambiguous on a write, because the
    service accepted it: the message may be on its way although we hold no ID for it.
    ``status_code`` is the 2xx status when the body was received, else None."""

    def __init__(self, operation: str, *, context: Context | None = None,
                 status_code: int | None = None, ambiguous: bool = False,
                 detail: str | None = None) -> None:
        super().__init__(operation, context=context, ambiguous=ambiguous, detail=detail)
        self.status_code = status_code

    def _summary(self) -> str:
        status = f"HTTP {self.status_code} " if self.status_code is not None else ""
        return f"{status}unreadable body" + (f" ({self.detail})" if self.detail else "")


_BY_STATUS: dict[int, type[ApiStatusError]] = {
    400: Rejected, 401: Unauthorized, 403: Forbidden, 404: NotFound, 422: Rejected,
    429: RateLimited,
}


def parse_retry_after_s(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After value: delay-seconds or an HTTP-date (RFC 9110).

    A date in the past gives 0.0; a missing or malformed value gives None. ``now`` is the
    reference time for a date (the response's Date header when present, else the clock).
    """
    text = (value or "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        when = _http_date(text)
        if when is None:
            return None
        return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _http_date(value: str | None) -> datetime | None:
    """An aware datetime from an HTTP-date, or None."""
    try:
        when = email.utils.parsedate_to_datetime(value or "")
    except (TypeError, ValueError, IndexError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def error_for_status(operation: str, response: httpx.Response, *,
                     context: Context | None = None) -> ApiStatusError:
    """The error for a non-2xx response. Reads only the status and headers, never the body."""
    status = response.status_code
    write = operation in WRITE_OPERATIONS
    if status in (429, 503):
        # the service's own Date header as "now", so clock skew does not bend the wait
        retry_after_s = parse_retry_after_s(response.headers.get("retry-after"),
                                            now=_http_date(response.headers.get("date")))
    else:
        retry_after_s = None
    if status == 429:
        return RateLimited(operation, status_code=status, context=context, retry_after_s=retry_after_s)
    if 500 <= status <= 599:
        return ServerError(operation, status_code=status, context=context,
                           retry_after_s=retry_after_s, ambiguous=write)
    cls = _BY_STATUS.get(status, ApiStatusError)
    return cls(operation, status_code=status, context=context)


def error_for_transport(operation: str, exc: httpx.TransportError, *,
                        context: Context | None = None) -> NotSent | OutcomeUnknown:
    """NotSent or OutcomeUnknown for an httpx transport failure (see the module docstring)."""
    detail = type(exc).__name__
    if operation not in WRITE_OPERATIONS or isinstance(exc, _NEVER_LEFT):
        return NotSent(operation, context=context, detail=detail)
    return OutcomeUnknown(operation, context=context, detail=detail)


def _validation_detail(exc: pydantic.ValidationError) -> str:
    """Where validation failed, by field path only: no input values (they hold personal data)."""
    parts = []
    for item in exc.errors(include_input=False, include_url=False)[:3]:
        loc = ".".join(str(p) for p in item["loc"] if isinstance(p, int) or str(p).isidentifier())
        parts.append(f"{loc or '<root>'}:{item['type']}")
    return "invalid " + ", ".join(parts)


@contextlib.contextmanager
def map_errors(operation: str, *, context: Context | None = None) -> Iterator[None]:
    """Translate everything one API call can raise into the ApiError tree.

    Wrap the send, ``raise_for_status()`` and the parsing of the body::

        with map_errors("listMessages", context={"conversation_id": 7}):
            response = http.get(...)
            response.raise_for_status()
            return parse(response.json())
    """
    if operation not in WRITE_OPERATIONS and operation not in READ_OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}")
    write = operation in WRITE_OPERATIONS
    try:
        yield
    except httpx.TransportError as exc:
        raise error_for_transport(operation, exc, context=context) from None
    except httpx.HTTPStatusError as exc:
        raise error_for_status(operation, exc.response, context=context) from None
    except httpx.DecodingError:
        raise UnexpectedResponse(operation, context=context, ambiguous=write,
                                 detail="content decoding failed") from None
    except pydantic.ValidationError as exc:
        raise UnexpectedResponse(operation, context=context, ambiguous=write,
                                 detail=_validation_detail(exc)) from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UnexpectedResponse(operation, context=context, ambiguous=write,
                                 detail="not JSON") from None
