"""The operators' dashboard: server-rendered pages (Jinja2, no JavaScript) over the store.

- ``/``: counts by state and by error kind over the last hour, day and week; the last hour's
  trends drawn as SVG (charts.py); what is set aside; which workspaces the circuit breaker holds;
  a link to Flower.
- ``/notifications``: the list, filtered by state, route, workspace, error kind, time and event
  ID, newest first, page by page.
- ``/notification?event=<event_id>``: one notification's record and timeline, with the actions
  that apply (cancel one not sent yet, run one set aside again). The event ID travels in the query,
  never the path: an ID such as ``..`` would be resolved away by the browser in a path.
- ``/set-aside``: notifications and webhook deliveries set aside for an operator.

Behind HTTP Basic authentication: any user name, the ``operator_token`` as password (the browser
asks once). Actions are POST forms carrying a token derived from the operator token, so another
site cannot make an operator's browser act. No page shows message content or contact data: the
store keeps none outside the payload, and no page reads the payload.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode

import jinja2
from pydantic import SecretStr
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from dispatcher.errors import ConfigurationError, DispatcherError, TooLate, UnknownNotification
from dispatcher.lifecycle import overview as reads
from dispatcher.lifecycle import trends
from dispatcher.lifecycle.moves import SET_ASIDE_KINDS
from dispatcher.lifecycle.states import NotificationState
from dispatcher.operations.dashboard.charts import TrendCharts, draw_trends
from dispatcher.operations.since import parse_since
from dispatcher.policy.breaker import Breaker
from dispatcher.store import queries as store
from dispatcher.store.db import require_existing_store
from dispatcher.store.record import NotificationRecord, NotificationSummary

if TYPE_CHECKING:
    from dispatcher.service import Dispatcher

TEMPLATES = Jinja2Templates(env=jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"), autoescape=True))
PAGE_SIZE = 50
CANCELLABLE = {NotificationState.SCHEDULED.value, NotificationState.QUEUED.value}
# What an action's answer page says: fixed texts by code, never words a link could bring in.
DONE = {"cancelled": "Cancelled: nothing of it is sent.", "retried": "Handed to the workers again.",
        "refused": "Not done: it is neither failed nor set aside, or its request is needed (dispatcher retry --file)."}
_HEADERS = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
                                       "form-action 'self'; frame-ancestors 'none'"}


def create_dashboard_app(dispatcher: Dispatcher, *, token: SecretStr | str | None, flower_url: str | None = None,
                         breakers: Mapping[str, Breaker] | None = None) -> Starlette:
    """The dashboard over ``dispatcher`` (a :class:`~dispatcher.service.Dispatcher`); ``token`` is
    the operator token (ConfigurationError when missing). ``breakers``: each workspace's circuit
    breaker, read without taking its probe (None: not shown)."""
    secret = token.get_secret_value() if isinstance(token, SecretStr) else token
    if not secret or not secret.strip():
        raise ConfigurationError("DISPATCHER_OPERATOR_TOKEN (operator_token)", "is required to serve the dashboard")
    expected = hashlib.sha256(secret.strip().encode()).digest()
    form_token = hmac.new(secret.strip().encode(), b"dashboard-form", hashlib.sha256).hexdigest()

    def allowed(request: Request) -> bool:
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            _, _, password = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return hmac.compare_digest(hashlib.sha256(password.strip().encode()).digest(), expected)

    def page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
        base = {"flower_url": flower_url, "form_token": form_token, "now": datetime.now(UTC)}
        return TEMPLATES.TemplateResponse(request, name, {**base, **context}, status_code=status_code,
                                          headers=_HEADERS)

    def guarded(view: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            if not allowed(request):
                return PlainTextResponse("the operator token is required", status_code=401,
                                         headers={"WWW-Authenticate": 'Basic realm="dispatcher", charset="UTF-8"',
                                                  **_HEADERS})
            if request.method == "POST":
                if not hmac.compare_digest(await _form_token_of(request), form_token):
                    return PlainTextResponse("this form is not the dashboard's", status_code=403, headers=_HEADERS)
            try:
                response: Response = await view(request)
            except SQLAlchemyError as error:  # the class only: a driver's text may quote a statement
                return PlainTextResponse(f"the store did not answer ({type(error).__name__}); try again",
                                         status_code=503, headers={"Retry-After": "5", **_HEADERS})
            return response
        return endpoint

    async def home(request: Request) -> Response:
        def read() -> tuple[reads.Overview, TrendCharts]:
            now = datetime.now(UTC)
            with dispatcher.sessions() as session:
                return reads.overview(session, now=now), draw_trends(trends.trends(session, now=now))
        def held() -> list[reads.PausedWorkspace] | str:
            """The paused workspaces, or why they cannot be told."""
            if breakers is None:
                return "not shown: the workers share no breaker this page can read (no Redis)"
            try:
                pauses = [(name, breaker.peek()) for name, breaker in sorted(breakers.items())]
            except Exception as error:  # the page still shows everything else
                return f"unknown: Redis did not answer ({type(error).__name__})"
            return [reads.PausedWorkspace(name, pause.reason, pause.detail, datetime.fromtimestamp(pause.until, UTC))
                    for name, pause in pauses if pause is not None]
        overview, charts = await run_in_threadpool(read)
        return page(request, "overview.html", {"overview": overview, "trends": charts,
                                               "windows": [name for name, _ in reads.ERROR_WINDOWS],
                                               "paused": await run_in_threadpool(held)})

    async def notifications(request: Request) -> Response:
        query = request.query_params
        try:
            filters = store.NotificationFilter(
                state=_choice(query.get("state"), [state.value for state in NotificationState]),
                route=query.get("route") or None, workspace=query.get("workspace") or None,
                error_kind=query.get("error") or None, since=_since(query.get("since")),
                before_id=_positive(query.get("before")))
        except ValueError as error:
            return page(request, "notifications.html", {"rows": [], "query": dict(query), "problem": str(error),
                                                        "states": list(NotificationState), "next_page": None}, 400)
        event_id = (query.get("event") or "").strip()

        def read() -> list[NotificationSummary]:
            with dispatcher.sessions() as session:
                if event_id:
                    found = store.find_notification_by_event(session, event_id)
                    return [NotificationSummary.of(found)] if found is not None else []
                return [NotificationSummary.of(row)
                        for row in store.recent_notifications(session, filters=filters, limit=PAGE_SIZE)]
        rows = await run_in_threadpool(read)
        next_page = None
        if len(rows) == PAGE_SIZE:
            next_page = "?" + urlencode({**{key: value for key, value in query.items() if key != "before"},
                                         "before": rows[-1].cursor})
        return page(request, "notifications.html", {"rows": rows, "query": dict(query), "problem": None,
                                                    "states": list(NotificationState), "next_page": next_page})

    async def notification(request: Request) -> Response:
        event_id = request.query_params.get("event", "")

        def read() -> tuple[NotificationRecord, list[reads.TimelineEntry], bool] | None:
            with dispatcher.sessions() as session:
                found = store.find_notification_by_event(session, event_id)
                if found is None:
                    return None
                record = NotificationRecord.of(found, store.attempts_of(session, found.id))
                return record, reads.timeline(session, found), found.error_kind in SET_ASIDE_KINDS
        found = await run_in_threadpool(read)
        if found is None:
            return page(request, "missing.html", {"event_id": event_id}, 404)
        record, steps, set_aside = found
        done = request.query_params.get("done")
        said = DONE.get(done or "")
        if done == "too_late" and request.query_params.get("state") in {state.value for state in NotificationState}:
            said = f"Too late: it is {request.query_params['state']}."
        return page(request, "notification.html", {
            "record": record, "timeline": steps, "can_cancel": record.state in CANCELLABLE, "can_retry": set_aside,
            "done": said, "query": urlencode({"event": event_id})})

    async def act(request: Request) -> Response:
        event_id, action = request.query_params.get("event", ""), str(request.path_params["action"])
        answer = {"event": event_id}
        try:
            if action == "cancel":
                await run_in_threadpool(dispatcher.cancel, event_id)
                answer["done"] = "cancelled"
            elif action == "retry":
                await run_in_threadpool(dispatcher.retry, event_id)
                answer["done"] = "retried"
            else:
                return PlainTextResponse("no such action", status_code=404, headers=_HEADERS)
        except TooLate as late:
            answer["done"], answer["state"] = "too_late", late.state  # said on the page, not written
        except UnknownNotification:
            return page(request, "missing.html", {"event_id": event_id}, 404)
        except DispatcherError:
            answer["done"] = "refused"
        return RedirectResponse(f"/notification?{urlencode(answer)}", status_code=303, headers=_HEADERS)

    async def set_aside(request: Request) -> Response:
        def read() -> tuple[list[NotificationSummary], list[store.SetAsideDelivery]]:
            with dispatcher.sessions() as session:
                return ([NotificationSummary.of(row) for row in reads.set_aside_notifications(session)],
                        store.set_aside_deliveries(session, limit=200))
        rows, deliveries = await run_in_threadpool(read)
        return page(request, "set_aside.html", {"rows": rows, "deliveries": deliveries})

    return Starlette(routes=[
        Route("/", guarded(home), methods=["GET"]),
        Route("/notifications", guarded(notifications), methods=["GET"]),
        Route("/notification", guarded(notification), methods=["GET"]),
        Route("/notification/{action:str}", guarded(act), methods=["POST"]),
        Route("/set-aside", guarded(set_aside), methods=["GET"]),
    ])


async def _form_token_of(request: Request) -> str:
    """The ``form_token`` field of a small urlencoded form (the dashboard's own forms hold nothing else)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return ""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > 4096:
            return ""
    return parse_qs(body.decode("utf-8", "replace")).get("form_token", [""])[0]


def _choice(value: str | None, allowed: list[str]) -> str | None:
    if not value:
        return None
    if value not in allowed:
        raise ValueError(f"state: one of {', '.join(allowed)}")
    return value


def _since(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return parse_since(value, now=datetime.now(UTC))
    except ValueError as problem:
        raise ValueError(f"since: {problem}") from None


def _positive(value: str | None) -> int | None:
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) < 2 ** 63:
        raise ValueError("before: the cursor of the previous page")
    return int(value)


def app_from_environment() -> Starlette:
    """The zero-argument factory for uvicorn: settings from the environment; each workspace's
    circuit breaker read where the workers share it (Redis), else not shown."""
    from dispatcher.context import make_breaker
    from dispatcher.service import Dispatcher
    from dispatcher.settings import load_settings

    settings = load_settings()
    require_existing_store(settings.database_url)  # a wrong path is said, not served as an empty store
    # A page waits a second at most for Redis, then says the breaker's state is unknown.
    breakers = ({name: make_breaker(settings.for_workspace(name), timeout_s=1.0) for name in settings.workspace_names}
                if settings.limiter_redis_url is not None else None)
    return create_dashboard_app(Dispatcher(settings, migrate=settings.database_url.startswith("sqlite")),
                                token=settings.operator_token, flower_url=settings.flower_url, breakers=breakers)
