"""HTTP intake for hosts not written in Python: the same ``notify`` and ``status``, over JSON.

``POST /v1/notifications`` hands over one notification request (the JSON of
:class:`~dispatcher.intake.request.NotificationRequest`); ``GET /v1/notifications/{event_id}`` reads its
record back, ``DELETE`` there cancels it (409 ``too_late`` with its state once a worker has it) and
``PATCH`` with ``{"send_at": ...}`` moves a scheduled one, and ``POST`` there (with the request, for
a failed one) retries it. docs/http-intake.md has every answer with an example body. In this order, a POST is:

1. authenticated: ``Authorization: Bearer <token>``, compared in constant time (401 with
   ``WWW-Authenticate: Bearer`` when missing or wrong; nothing else is looked at before this);
2. checked against the send backlog: with ``intake_max_backlog`` notifications waiting for a
   worker, 429 with ``Retry-After`` (see :mod:`dispatcher.intake.backlog`);
3. checked for ``Content-Type: application/json`` (415);
4. read up to ``max_body_bytes`` (default 64 KiB): a larger ``Content-Length``, or a streamed body
   passing the limit, answers 413 at once without reading the rest;
5. parsed as JSON (400, field ``body``);
6. handed to :meth:`Dispatcher.notify <dispatcher.service.Dispatcher.notify>` in the threadpool:
   ``InvalidEvent`` answers 422 naming the field, ``EventConflict`` 409; a store failure 503;
7. answered 202 with ``{"event_id", "state", "status_url"}`` and a ``Location`` header, for a new
   request and for a repeat of an identical one alike (the repeat carries the stored state).

Errors are JSON ``{"error": <code>, "field": <dotted field>, "detail": <problem>}`` and never
repeat the request body: ``InvalidEvent`` messages carry no values, and a field naming a key
that is not a plain name (an unknown key that looks like a phone number, say) ends in ``*``.
The module logger gets the event ID (when well formed), the status code and the error field only.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any
from urllib.parse import quote, unquote

from pydantic import SecretStr
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dispatcher.errors import (
    ConfigurationError,
    EventConflict,
    InvalidEvent,
    StateConflict,
    TooLate,
    UnknownNotification,
)
from dispatcher.http_framing import RefuseDoubleFraming
from dispatcher.intake.backlog import BacklogGate
from dispatcher.intake.batch import BatchItem
from dispatcher.intake.openapi import OPENAPI_PATH, intake_document
from dispatcher.intake.request import ContactDetails, NotificationRequest, TemplateChoice
from dispatcher.recipients.controls import Recipients
from dispatcher.service import Dispatcher
from dispatcher.settings import DEFAULT_WORKSPACE, ENV_PREFIX, load_settings

log = logging.getLogger(__name__)

NOTIFICATIONS_PATH = "/v1/notifications"
RECIPIENTS_PATH = "/v1/recipients"
BATCHES_PATH = "/v1/notification-batches"
BATCH_BODY_FACTOR = 64  # a batch's body may be this many single bodies long (4 MiB by default): 1,000 reminders fit
DEFAULT_MAX_BODY_BYTES = 64 * 1024
DEFAULT_RETRY_AFTER_S = 10
TOKEN_VARIABLE = f"{ENV_PREFIX}INTAKE_TOKEN"

_EVENT_ID = re.compile(r"^[\x21-\x7e]{1,200}$")  # as NotificationRequest.event_id
_PLAIN_FIELD = re.compile(r"^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}$")
_SCHEMA_NAMES = frozenset({"body", *NotificationRequest.model_fields, *ContactDetails.model_fields,
                           *TemplateChoice.model_fields, "recipient", "reference", "header", "action"})
_NO_STORE = {"Cache-Control": "no-store"}
# Every method reaches the endpoints, so that a wrong one is answered 405 in JSON too.
_ANY_METHOD = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# What each method asks of one notification (its URL names it).
_ITEM_METHODS = {"GET": "read", "DELETE": "cancel", "PATCH": "reschedule", "POST": "retry"}


class _Refusal(Exception):
    """An answer other than success, decided before the dispatcher is called."""

    def __init__(self, status: int, error: str, field: str | None = None, detail: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(error)
        self.status, self.error, self.field, self.detail = status, error, field, detail
        self.headers = headers or {}


_STORE_UNAVAILABLE = _Refusal(503, "store_unavailable", None, "the store is unavailable; try again", {"Retry-After": "5"})
_INTERNAL_ERROR = _Refusal(500, "internal_error", None, "the request could not be handled; try again")


def _recipient_field(data: dict[str, Any]) -> dict[str, Any]:
    recipient = data.get("recipient")
    if not isinstance(recipient, dict):
        raise InvalidEvent("recipient", "is required: an object with identifier, phone_number or email")
    return recipient


def _text(data: dict[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidEvent(name, "must be a string")
    return value


_RECIPIENT_ACTIONS: dict[str, Callable[[Recipients, dict[str, Any]], dict[str, Any]]] = {
    "suppress": lambda d, data: {"added": d.suppress(_recipient_field(data), channel=_text(data, "channel"),
                                                     category=_text(data, "category"))},
    "unsuppress": lambda d, data: {"lifted": d.unsuppress(_recipient_field(data), channel=_text(data, "channel"),
                                                          category=_text(data, "category"))},
    "check": lambda d, data: {"suppressed": d.is_suppressed(_recipient_field(data),
                                                            channel=_text(data, "channel") or "",
                                                            category=_text(data, "category") or "service")},
    "consent": lambda d, data: {"recorded": d.record_consent(_recipient_field(data), reference=_text(data, "reference") or "",
                                                             channel=_text(data, "channel") or "web_session")},
    "withdraw_consent": lambda d, data: {"withdrawn": d.withdraw_consent(
        _recipient_field(data), channel=_text(data, "channel") or "web_session")},
}


def create_intake_routes(
    dispatcher: Dispatcher, *, token: SecretStr | str | None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_backlog: int = 0, retry_after_s: int = DEFAULT_RETRY_AFTER_S,
) -> list[Route]:
    """The two intake routes, to mount in any Starlette app (the webhook receiver's, for one).

    ``token`` is the bearer token that reaches the default workspace (None: no token does; the
    workspaces' own ``intake_token`` reach theirs). An empty one, or no token at all, is refused
    with :class:`~dispatcher.errors.ConfigurationError` (an intake nobody can call is a mistake).
    ``max_backlog`` notifications waiting for a worker make a POST answer 429 (0: never).
    """
    # Each token reaches one workspace's notifications: the default one's (``token``), or the one
    # whose ``intake_token`` it is (docs/workspaces.md).
    workspace_of = {_token_digest(token): DEFAULT_WORKSPACE} if token is not None else {}
    for name, scoped_token in dispatcher.settings.intake_tokens().items():
        if name != DEFAULT_WORKSPACE:
            workspace_of[_token_digest(scoped_token)] = name
    if not workspace_of:
        raise ConfigurationError(f"{TOKEN_VARIABLE} (intake_token)", "is required to serve the HTTP intake "
                                 "(or a workspace's intake_token)")
    if max_body_bytes <= 0:
        raise ValueError("max_body_bytes must be positive")
    backlog = BacklogGate(dispatcher.sessions, max_backlog=max_backlog)
    backlogged = _Refusal(429, "backlogged", None,
                          "too many notifications are waiting to be sent; hand this one over again later",
                          {"Retry-After": str(retry_after_s)})

    def authenticate(request: Request) -> str:
        """The workspace the request's bearer token reaches; 401 for none."""
        scheme, _, presented = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise _Refusal(401, "unauthorized", "authorization", "a bearer token is required",
                           {"WWW-Authenticate": "Bearer"})
        # Digests of equal length: the comparison reveals neither the token nor its length.
        # Header values arrive decoded as latin-1: encoding back gives the bytes the client sent.
        presented_digest = hashlib.sha256(presented.strip().encode("latin-1")).digest()
        reached = None
        for digest, name in workspace_of.items():  # every one compared, so the time says nothing of which
            if hmac.compare_digest(presented_digest, digest):
                reached = name
        if reached is None:
            raise _Refusal(401, "unauthorized", "authorization", "the bearer token is not valid",
                           {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        return reached

    def scoped(data: Any, workspace: str) -> Any:
        """A request of the token's workspace: one naming no workspace takes it; one naming another
        is refused; anything but a JSON object is refused before (a JSON string holding a request
        would otherwise name no workspace and land in the default one)."""
        if not isinstance(data, dict):
            raise InvalidEvent("body", "must be a JSON object")
        named = data.get("workspace")
        if named is None:
            return data if workspace == DEFAULT_WORKSPACE else {**data, "workspace": workspace}
        if named != workspace:
            raise _Refusal(403, "forbidden", "workspace", "the bearer token is not this workspace's")
        return data

    async def notifications(request: Request) -> Response:
        if request.method != "POST":
            return _error(_Refusal(405, "method_not_allowed", "method", "use POST", {"Allow": "POST"}))
        event_id = "-"
        try:
            workspace = authenticate(request)
            if backlog.enabled and await run_in_threadpool(backlog.is_full):
                raise backlogged
            _check_content_type(request)
            body = await _read_body(request, max_body_bytes)
            data = _parse_json(body)
            event_id = _loggable_event_id(data)
            record = await run_in_threadpool(dispatcher.notify, scoped(data, workspace))
        except _Refusal as refusal:
            return _refused(refusal, event_id)
        except EventConflict as conflict:  # before InvalidEvent: it is one
            return _refused(_Refusal(409, "conflict", conflict.field, conflict.problem), event_id)
        except InvalidEvent as invalid:
            return _refused(_Refusal(422, "invalid_request", _safe_field(invalid.field), invalid.problem), event_id)
        except SQLAlchemyError as error:
            log.error("intake %s not stored: %s (503)", event_id, type(error).__name__)  # its text may hold values
            return _error(_STORE_UNAVAILABLE)
        except Exception as error:  # answered in JSON; the message is not logged, it might hold a value
            log.error("intake %s failed: %s (500)", event_id, type(error).__name__)
            return _error(_INTERNAL_ERROR)
        status_url = _status_url(request, record.event_id)
        log.info("intake %s accepted: %s (202)", record.event_id, record.state)
        return JSONResponse({"event_id": record.event_id, "state": record.state, "status_url": status_url},
                            status_code=202, headers={"Location": status_url, **_NO_STORE})

    async def notification(request: Request) -> Response:
        """``GET``: the record; ``DELETE``: cancel it; ``PATCH`` with ``{"send_at": ...}``: reschedule it;
        ``POST`` (with the request it was handed over with, for a failed one): retry it."""
        if request.method not in _ITEM_METHODS:
            allowed = ", ".join(_ITEM_METHODS)
            return _error(_Refusal(405, "method_not_allowed", "method", f"use {allowed}", {"Allow": allowed}))
        event_id = _event_id_of(request)
        logged = event_id if _EVENT_ID.fullmatch(event_id) else "-"
        asked = _ITEM_METHODS[request.method]
        try:
            workspace = authenticate(request)
            if not _EVENT_ID.fullmatch(event_id):
                raise UnknownNotification(event_id)
            if request.method == "PATCH":
                _check_content_type(request)
                send_at = _send_at_of(_parse_json(await _read_body(request, max_body_bytes)))
                record = await run_in_threadpool(partial(dispatcher.reschedule, workspace=workspace), event_id, send_at)
            elif request.method == "POST":
                body = await _read_body(request, max_body_bytes)
                if body.strip():
                    _check_content_type(request)
                handed_over = _parse_json(body) if body.strip() else None
                record = await run_in_threadpool(partial(dispatcher.retry, workspace=workspace), event_id,
                                                 scoped(handed_over, workspace) if handed_over is not None else None)
            elif request.method == "DELETE":
                record = await run_in_threadpool(partial(dispatcher.cancel, workspace=workspace), event_id)
            else:
                record = await run_in_threadpool(partial(dispatcher.status, workspace=workspace), event_id)
        except _Refusal as refusal:  # the path's ID is not logged for a caller that did not authenticate
            return _refused(refusal, "-")
        except UnknownNotification:  # not logged: an ID nobody handed over could be anything
            return _refused(_Refusal(404, "not_found", "event_id", "no notification with this event_id"), "-")
        except TooLate as late:
            log.info("intake %s %s: too late, it is %s (409)", logged, asked, late.state)
            return JSONResponse({"error": "too_late", "field": "state", "state": late.state,
                                 "detail": f"too late to {asked}: it is {late.state}"}, status_code=409, headers=_NO_STORE)
        except EventConflict as conflict:  # before InvalidEvent: it is one
            return _refused(_Refusal(409, "conflict", conflict.field, conflict.problem), logged)
        except InvalidEvent as invalid:
            return _refused(_Refusal(422, "invalid_request", _safe_field(invalid.field), invalid.problem), logged)
        except StateConflict as conflict:  # a retry of a notification that is not failed nor set aside
            return _refused(_Refusal(409, "not_retryable", "state", str(conflict)), logged)
        except SQLAlchemyError as error:
            log.error("intake %s %s not done: %s (503)", asked, logged, type(error).__name__)
            return _error(_STORE_UNAVAILABLE)
        except Exception as error:
            log.error("intake %s %s failed: %s (500)", asked, logged, type(error).__name__)
            return _error(_INTERNAL_ERROR)
        if request.method != "GET":
            log.info("intake %s %s: %s (200)", logged, asked, record.state)
        return JSONResponse(record.model_dump(mode="json"), headers=_NO_STORE)

    async def batches(request: Request) -> Response:
        """``POST /v1/notification-batches``: ``{"notifications": [<request>, ...]}``, up to 1,000;
        200 with a result per item, in their order (docs/http-intake.md)."""
        if request.method != "POST":
            return _error(_Refusal(405, "method_not_allowed", "method", "use POST", {"Allow": "POST"}))
        try:
            workspace = authenticate(request)
            if backlog.enabled and await run_in_threadpool(backlog.is_full):
                raise backlogged
            _check_content_type(request)
            data = _parse_json(await _read_body(request, max_body_bytes * BATCH_BODY_FACTOR))
            if not isinstance(data, dict) or set(data) != {"notifications"} or not isinstance(data["notifications"], list):
                raise InvalidEvent("body", "an object with notifications only: a list of notification requests")
            results = await run_in_threadpool(dispatcher.notify_many, [_scoped_item(item, workspace)
                                                                      for item in data["notifications"]])
        except _Refusal as refusal:
            return _refused(refusal, "-")
        except InvalidEvent as invalid:
            return _refused(_Refusal(422, "invalid_request", _safe_field(invalid.field), invalid.problem), "-")
        except SQLAlchemyError as error:
            log.error("intake batch not stored: %s (503)", type(error).__name__)
            return _error(_STORE_UNAVAILABLE)
        except Exception as error:
            log.error("intake batch failed: %s (500)", type(error).__name__)
            return _error(_INTERNAL_ERROR)
        log.info("intake batch: %s (200)", ", ".join(f"{count} {outcome}" for outcome, count in
                                                    sorted(Counter(r.outcome.value for r in results).items())))
        return JSONResponse({"results": [_item_answer(result) for result in results]}, headers=_NO_STORE)

    async def recipients(request: Request) -> Response:
        """``POST /v1/recipients/{action}``: the host's opt-out and consent controls (docs/opt-outs.md).
        The recipient travels in the body, never in the URL."""
        action = str(request.path_params.get("action", ""))
        if request.method != "POST":
            return _error(_Refusal(405, "method_not_allowed", "method", "use POST", {"Allow": "POST"}))
        try:
            workspace = authenticate(request)
            if action not in _RECIPIENT_ACTIONS:
                raise _Refusal(404, "not_found", "action", f"one of {', '.join(sorted(_RECIPIENT_ACTIONS))}")
            _check_content_type(request)
            data = _parse_json(await _read_body(request, max_body_bytes))
            if not isinstance(data, dict) or set(data) - {"recipient", "channel", "category", "reference"}:
                raise InvalidEvent("body", "an object with recipient and, as the action needs, channel, category, reference")
            answer = await run_in_threadpool(_RECIPIENT_ACTIONS[action], dispatcher.recipients_for(workspace), data)
        except _Refusal as refusal:
            return _refused(refusal, "-")
        except InvalidEvent as invalid:
            return _refused(_Refusal(422, "invalid_request", _safe_field(invalid.field), invalid.problem), "-")
        except SQLAlchemyError as error:
            log.error("recipients %s not done: %s (503)", action, type(error).__name__)
            return _error(_STORE_UNAVAILABLE)
        except Exception as error:
            log.error("recipients %s failed: %s (500)", action, type(error).__name__)
            return _error(_INTERNAL_ERROR)
        log.info("recipients %s: done (200)", action)
        return JSONResponse(answer, headers=_NO_STORE)

    async def openapi(request: Request) -> Response:
        """``GET /v1/openapi.json``: the intake's OpenAPI document (no token: it holds no data)."""
        return JSONResponse(intake_document())

    return [
        Route(OPENAPI_PATH, openapi, methods=["GET"], name="intake_openapi"),
        Route(RECIPIENTS_PATH + "/{action}", recipients, methods=_ANY_METHOD, name="intake_recipients"),
        Route(NOTIFICATIONS_PATH, notifications, methods=_ANY_METHOD, name="intake_notify"),
        Route(BATCHES_PATH, batches, methods=_ANY_METHOD, name="intake_batches"),
        Route(NOTIFICATIONS_PATH + "/{event_id:path}", notification, methods=_ANY_METHOD, name="intake_status"),
    ]


def create_intake_app(
    dispatcher: Dispatcher, *, token: SecretStr | str | None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_backlog: int = 0, retry_after_s: int = DEFAULT_RETRY_AFTER_S, on_shutdown: Sequence[Callable[[], Any]] = (),
) -> Starlette:
    """The intake alone, with ``GET /healthz``: for running it by itself and for tests.

    ``on_shutdown`` callables run when the app stops (closing the dispatcher's enqueuer, say).
    """
    routes = create_intake_routes(dispatcher, token=token, max_body_bytes=max_body_bytes, max_backlog=max_backlog,
                                  retry_after_s=retry_after_s)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        for close in on_shutdown:
            close()

    return Starlette(routes=[*routes, Route("/healthz", healthz, methods=["GET"])], lifespan=lifespan,
                     middleware=[Middleware(RefuseDoubleFraming)])


def app_from_environment() -> Starlette:
    """The zero-argument factory for ``uvicorn --factory``: settings and token from the environment.

    The tokens are the setting ``intake_token`` (``DISPATCHER_INTAKE_TOKEN``) and the workspaces'
    own; without any, start-up fails naming it.
    """
    settings = load_settings()
    token = settings.intake_token
    if not settings.intake_tokens():
        raise ConfigurationError(f"{TOKEN_VARIABLE} (intake_token)", "is required to serve the HTTP intake "
                                 "(or a workspace's intake_token)")
    dispatcher = Dispatcher(settings, migrate=settings.database_url.startswith("sqlite"))
    close = getattr(dispatcher.enqueuer, "close", None)
    return create_intake_app(dispatcher, token=token, max_body_bytes=settings.intake_max_body_bytes,
                             max_backlog=settings.intake_max_backlog, retry_after_s=settings.intake_retry_after_s,
                             on_shutdown=[close] if close else [])


def _token_digest(token: SecretStr | str) -> bytes:
    value = token.get_secret_value() if isinstance(token, SecretStr) else token
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{TOKEN_VARIABLE} (intake_token)", "must not be empty")
    return hashlib.sha256(value.strip().encode("utf-8")).digest()


def _check_content_type(request: Request) -> None:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise _Refusal(415, "unsupported_media_type", "content-type", "send the request as application/json")


async def _read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 as soon as it is known to pass ``limit`` bytes."""
    too_large = _Refusal(413, "body_too_large", "body", f"the request body is limited to {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise _Refusal(400, "malformed_request", "content-length", "is not a byte count")
        if int(declared) > limit:
            raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # also invalid UTF-8 and over-long integers
        raise _Refusal(400, "malformed_json", "body", "is not valid JSON") from None


def _scoped_item(item: Any, workspace: str) -> Any:
    """A batch item of the token's workspace (one naming none takes it). One naming another keeps
    its name and gets a workspace of its own that no configuration has, so it alone is refused,
    naming ``workspace``, without its request telling anything about the other workspace."""
    if not isinstance(item, dict):
        return None  # refused alone, naming the body: only a JSON object is a request here
    named = item.get("workspace")
    if named is None:
        return item if workspace == DEFAULT_WORKSPACE else {**item, "workspace": workspace}
    return item if named == workspace else {**item, "workspace": "-not-yours"}


def _item_answer(result: BatchItem) -> dict[str, Any]:
    """One item's result: index, event_id, outcome, and its state or its refusal (field, detail)."""
    answer: dict[str, Any] = {"index": result.index, "event_id": result.event_id, "outcome": result.outcome.value}
    if result.state is not None:
        answer["state"] = result.state
    if result.field is not None:
        answer["field"] = _safe_field(result.field)
    if result.problem is not None:
        answer["detail"] = result.problem
    return answer


def _send_at_of(data: Any) -> datetime:
    """A reschedule's body: ``{"send_at": "<ISO 8601 with a time zone>"}`` and nothing else."""
    if not isinstance(data, dict) or set(data) != {"send_at"} or not isinstance(data["send_at"], str):
        raise InvalidEvent("body", 'an object with send_at only, for example {"send_at": "2026-12-01T09:00:00+01:00"}')
    try:
        return datetime.fromisoformat(data["send_at"])
    except ValueError:
        raise InvalidEvent("send_at", "is not an ISO 8601 time (for example 2026-12-01T09:00:00+01:00)") from None


def _loggable_event_id(data: Any) -> str:
    event_id = data.get("event_id") if isinstance(data, dict) else None
    return event_id if isinstance(event_id, str) and _EVENT_ID.fullmatch(event_id) else "-"


def _safe_field(field: str) -> str:
    """The dotted field as :class:`InvalidEvent` names it, unless a key the host invented in it is
    not a plain name (it might be a phone number, an address or a piece of content): then the
    leading names of the request's own schema, followed by ``*``."""
    if _PLAIN_FIELD.fullmatch(field):
        return field
    known: list[str] = []
    for part in field.split("."):
        if part not in _SCHEMA_NAMES:
            break
        known.append(part)
    return ".".join([*known, "*"])


def _status_url(request: Request, event_id: str) -> str:
    # root_path: the mount point (and a proxy's prefix), so the URL works wherever we are mounted.
    return f"{request.scope.get('root_path', '')}{NOTIFICATIONS_PATH}/{quote(event_id, safe='')}"


def _event_id_of(request: Request) -> str:
    """The event ID in the path, percent-decoded exactly once. From ``raw_path`` when the server
    gives it (some ASGI clients decode ``path`` twice, turning an ID's "%2520" into a space);
    else from the decoded path."""
    raw = request.scope.get("raw_path")
    marker = NOTIFICATIONS_PATH + "/"
    if raw:
        raw_path = raw.split(b"?", 1)[0].decode("latin-1")
        start = raw_path.find(marker)
        if start >= 0:
            return unquote(raw_path[start + len(marker):], errors="replace")
    return str(request.path_params["event_id"])


def _refused(refusal: _Refusal, event_id: str) -> Response:
    log.warning("intake %s refused: %d %s (field %s)", event_id, refusal.status, refusal.error, refusal.field or "-")
    return _error(refusal)


def _error(refusal: _Refusal) -> Response:
    body: dict[str, str] = {"error": refusal.error}
    if refusal.field is not None:
        body["field"] = refusal.field
    if refusal.detail is not None:
        body["detail"] = refusal.detail
    return JSONResponse(body, status_code=refusal.status, headers={**refusal.headers, **_NO_STORE})
