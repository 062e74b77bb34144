"""The webhook receiver: a Starlette app that verifies, records and queues deliveries.

``POST <webhook_path>``, in this order (docs/receiver.md has the table of answers):

1. size: ``Content-Length`` over ``webhook_max_body_bytes``, or a streamed body passing it,
   answers 413 ``body_too_large`` at once, without reading the rest;
2. :func:`~dispatcher.tracking.webhooks.verify.verify_delivery` on the raw bytes (401 / 400 / 503);
3. JSON, only now: not UTF-8, not JSON, not an object, no ``event``, or a string holding a NUL or
   a lone surrogate (``\\u0000``, ``\\ud800``: nothing could store or apply it) answers 400
   ``malformed_body``;
4. the summary (IDs and status only, :mod:`dispatcher.tracking.webhooks.events`) is inserted and
   committed under the delivery ID; an ID recorded before answers 200 ``duplicate`` and
   nothing else happens;
5. the row ID is published to the outcomes queue; if that fails the answer is still 200
   (the row stays unprocessed and the tracking sweep publishes it), with a warning logged;
6. 200 ``accepted``. A store failure answers 503 ``store_unavailable`` (nothing was recorded).

The same app serves ``GET /healthz``, ``GET /metrics`` (Prometheus: verdicts, notifications by
state) and, when an ``intake_token`` is set, the HTTP intake (:mod:`dispatcher.intake.http`).

Steps 4 and 5 are a group commit: one writer at a time runs in Starlette's threadpool, off the
event loop; deliveries verified while it writes wait and go together in the next transaction
and the next broker pipeline. Each request still waits for its own commit (and publish) before
it is answered, so a 200 always means "recorded"; one delivery alone is written at once.

A refusal stores nothing and publishes nothing. Logs carry the reason, the status and the
delivery ID (when well formed), never the body, a header's other values or a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dispatcher import tracing
from dispatcher.errors import WebhookRejected
from dispatcher.http_framing import RefuseDoubleFraming
from dispatcher.metrics import CONTENT_TYPE_LATEST, WEBHOOK_VERDICTS, NotificationStates, deployment_collectors, render
from dispatcher.recipients.keywords import vocabulary
from dispatcher.settings import Settings, load_settings
from dispatcher.store.db import UNSTORABLE_TEXT, session_factory, shared_engine, takes_writes
from dispatcher.tracking.webhooks.deliveries import CeleryOutcomePublisher, NewDelivery, Publish, record_deliveries
from dispatcher.tracking.webhooks.events import EventSummary, body_digest, summarize
from dispatcher.tracking.webhooks.verify import DELIVERY_ID, verify_delivery
from dispatcher.tracking.webhooks.writer import GroupWriter

log = logging.getLogger(__name__)

ACCEPTED = b'{"status":"accepted"}'
DUPLICATE = b'{"status":"duplicate"}'


def create_receiver_app(settings: Settings, *, sessions: sessionmaker[Session] | None = None,
                        publish: Publish | None = None, clock: Callable[[], float] = time.time) -> Starlette:
    """The receiver app. ``sessions`` defaults to the settings' database, ``publish`` to a Celery
    producer on the settings' broker; ``clock`` (unix seconds) is "now" for the replay window."""
    secrets = [secret.get_secret_value() for secret in settings.webhook_secrets]
    body_timeout_s, store_timeout_s = settings.receiver_body_timeout_s, settings.receiver_store_timeout_s
    prefixes, limit = settings.webhook_header_prefixes, settings.webhook_max_body_bytes
    read = delivery_reader(settings)
    delivery_headers = [f"x-{prefix.lower()}-delivery" for prefix in prefixes]
    if not any(secrets):
        log.error("no webhook secret configured: every delivery is refused (set DISPATCHER_WEBHOOK_SECRETS)")
    owned: list[Any] = []
    if sessions is None:
        sessions = session_factory(shared_engine(settings.database_url))
    if publish is None:
        publisher = CeleryOutcomePublisher(settings.broker_url)
        owned.append(publisher)
        publish = publisher
    store, send = sessions, publish

    def record_and_publish(batch: Sequence[NewDelivery]) -> list[bytes]:
        row_ids = record_deliveries(store, batch)
        new: dict[str, int] = {}
        for delivery, row_id in zip(batch, row_ids, strict=True):
            if row_id is None:
                log.info("duplicate webhook delivery %s acknowledged", delivery.delivery_id)
            else:
                new[delivery.delivery_id] = row_id
        _publish(send, new)
        return [DUPLICATE if row_id is None else ACCEPTED for row_id in row_ids]

    writer: GroupWriter[NewDelivery, bytes] = GroupWriter(record_and_publish)

    def receiver_for(read: Callable[[Mapping[str, str], bytes, float], NewDelivery]) -> Callable[[Request], Awaitable[Response]]:
        """One workspace's endpoint: its secrets verify, its name goes with each delivery."""

        async def receive(request: Request) -> Response:
            return await _receive(request, read)

        return receive

    async def _receive(request: Request, read: Callable[[Mapping[str, str], bytes, float], NewDelivery]) -> Response:
        try:
            try:
                async with asyncio.timeout(body_timeout_s):  # a timer, no extra task on the hot path
                    body = await _read_body(request, limit)
            except TimeoutError:
                raise WebhookRejected("body_timeout", status_code=408) from None
            delivery = read(request.headers, body, clock())
        except WebhookRejected as refusal:
            WEBHOOK_VERDICTS.labels(verdict=refusal.reason).inc()
            delivery_id = next((request.headers[name] for name in delivery_headers if name in request.headers), "")
            log.warning("webhook delivery %s refused: %s (%d)",
                        delivery_id if DELIVERY_ID.fullmatch(delivery_id) else "-", refusal.reason, refusal.status_code)
            return _refusal(refusal.reason, refusal.status_code)
        if writer.waiting > MAX_WAITING_WRITES:  # the store is stuck: refuse at once, hold nothing more
            WEBHOOK_VERDICTS.labels(verdict="store_unavailable").inc()
            return _refusal("store_unavailable", 503)
        # A frozen store must not hold the request: past the timeout it is answered 503. The
        # timeout cancels only this request's wait: its write stays queued and may still land
        # (the writer skips a cancelled waiter; a repeat is recognised by its delivery ID).
        try:
            async with asyncio.timeout(store_timeout_s):
                answer = await writer.submit(delivery)
        except (SQLAlchemyError, TimeoutError) as error:
            WEBHOOK_VERDICTS.labels(verdict="store_unavailable").inc()
            log.error("webhook delivery %s not recorded: %s", delivery.delivery_id, type(error).__name__)
            # A stock workspace never sends it again: hand the delivery itself to the consumer, which
            # records and applies it once the store answers. A read of the message list would not do:
            # a status a late callback overwrote since is in this delivery only (issue 44).
            await run_in_threadpool(_hand_over, send, delivery)
            return _refusal("store_unavailable", 503)
        WEBHOOK_VERDICTS.labels(verdict="duplicate" if answer == DUPLICATE else "accepted").inc()
        return Response(answer, media_type="application/json")

    async def healthz(request: Request) -> Response:
        """Liveness: the process answers. Never depends on the store or the broker."""
        return Response(b'{"status":"ok"}', media_type="application/json")

    store_probe = SingleFlight(_store_takes_writes(store))

    async def readyz(request: Request) -> Response:
        """Readiness: the store would take a delivery's write now and the broker answers, each
        within a bound, and the writer is not refusing deliveries for a backlog."""
        database, broker = await asyncio.gather(store_probe.within(READY_CHECK_TIMEOUT_S),
                                                _within(READY_CHECK_TIMEOUT_S, _broker_answers(send)))
        results = [database and writer.waiting <= MAX_WAITING_WRITES, broker]
        verdicts = {name: "ok" if ok else "down" for name, ok in zip(("database", "broker"), results, strict=True)}
        return Response(json.dumps(verdicts).encode(), status_code=200 if all(results) else 503,
                        media_type="application/json")

    states = NotificationStates(store)
    deployment = deployment_collectors(settings)

    async def metrics(request: Request) -> Response:
        """This process's metrics always; the store's counts and the breakers' states only when
        they answer in time."""
        try:
            body = await asyncio.wait_for(run_in_threadpool(render, states, *deployment), timeout=READY_CHECK_TIMEOUT_S)
        except TimeoutError:
            body = await run_in_threadpool(render)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    # The default workspace's webhooks come to webhook_path, another workspace's to webhook_path/<name>.
    workspace_routes = [Route(f"{settings.webhook_path}/{name}", receiver_for(delivery_reader(settings.for_workspace(name))),
                            methods=["POST"])
                        for name in sorted(settings.workspaces)]
    routes = [Route(settings.webhook_path, receiver_for(read), methods=["POST"]), *workspace_routes,
              Route("/healthz", healthz, methods=["GET"]),
              Route("/readyz", readyz, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
    if settings.intake_tokens():  # the default workspace's token, or only some workspaces' own
        # HTTP intake for hosts not written in Python, beside the receiver (docs/http-intake.md).
        from dispatcher.intake.http import create_intake_routes
        from dispatcher.service import Dispatcher

        intake = Dispatcher(settings)
        owned.append(intake.enqueuer)
        routes += create_intake_routes(intake, token=settings.intake_token, max_body_bytes=settings.intake_max_body_bytes,
                                       max_backlog=settings.intake_max_backlog, retry_after_s=settings.intake_retry_after_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        for resource in owned:
            close = getattr(resource, "close", None)
            if close is not None:
                close()

    return Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(RefuseDoubleFraming)])


def app_from_environment() -> Starlette:
    """The zero-argument factory for ``uvicorn --factory``: settings from the environment."""
    settings = load_settings()
    tracing.configure(settings, service="dispatcher-receiver")  # its HTTP intake starts notifications' traces
    return create_receiver_app(settings)


async def _read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 as soon as it is known to pass ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise WebhookRejected("malformed_header", status_code=400)
        if int(declared) > limit:
            raise WebhookRejected("body_too_large", status_code=413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise WebhookRejected("body_too_large", status_code=413)
        chunks.append(chunk)
    return b"".join(chunks)


def delivery_reader(settings: Settings) -> Callable[[Mapping[str, str], bytes, float], NewDelivery]:
    """The receiver's work on one request once its body is read: verify the signature and the
    replay window at ``now`` (unix seconds), and summarise the event for the store. Raises
    WebhookRejected. The deterministic simulation feeds the sandbox's deliveries through it too."""
    secrets = [secret.get_secret_value() for secret in settings.webhook_secrets]
    prefixes, window_s = settings.webhook_header_prefixes, settings.webhook_replay_window_s
    reply_words = vocabulary(settings.routes.values())  # an incoming reply is kept only as one of these

    def read(headers: Mapping[str, str], body: bytes, now: float) -> NewDelivery:
        verified = verify_delivery(headers, body, secrets=secrets, prefixes=prefixes, window_s=window_s, now=now)
        summary = _summary(body, reply_words, settings.hashing_key)
        # Published to run at once, also without a status: the consumer reads a message's first
        # status-less update at once and coalesces the ones after it (docs/tracking.md).
        return NewDelivery(verified.delivery_id, summary.event, summary.model_dump(mode="json"),
                           datetime.fromtimestamp(now, UTC), workspace=settings.workspace_name)

    return read


def _storable(value: object) -> bool:
    """No string in the parsed body (keys included) holds a NUL or a lone surrogate."""
    if isinstance(value, str):
        return UNSTORABLE_TEXT.search(value) is None  # the store could never keep it, nor apply it
    if isinstance(value, dict):
        return all(_storable(key) and _storable(item) for key, item in value.items())
    if isinstance(value, list):
        return all(_storable(item) for item in value)
    return True


def _summary(body: bytes, reply_words: frozenset[str], hashing_key: bytes) -> EventSummary:
    try:
        # Strict UTF-8 first: json.loads would let encoded surrogates through ("surrogatepass").
        text = body.decode("utf-8")
        payload = json.loads(text)
    except (ValueError, RecursionError):  # also invalid UTF-8 and over-long integers
        raise WebhookRejected("malformed_body", status_code=400) from None
    # Only an escape can put a NUL or a surrogate in a parsed string (raw ones are invalid JSON or UTF-8).
    if "\\u" in text and not _storable(payload):
        raise WebhookRejected("malformed_body", status_code=400)
    summary = (summarize(payload, reply_words=reply_words, hashing_key=hashing_key,
                         digest=body_digest(body, key=hashing_key)) if isinstance(payload, dict) else None)
    if summary is None:
        raise WebhookRejected("malformed_body", status_code=400)
    return summary


READY_CHECK_TIMEOUT_S = 2.0
MAX_WAITING_WRITES = 10_000  # deliveries queued for a store that does not answer; past it, 503 at once


async def _within(timeout_s: float, check: Callable[[], bool]) -> bool:
    try:
        return await asyncio.wait_for(run_in_threadpool(check), timeout=timeout_s)
    except TimeoutError:
        return False


class SingleFlight:
    """One run of a blocking check at a time, in the thread pool: a caller that comes while it
    runs waits for that run. A store that hangs then holds one thread, not one per probe (a load
    balancer asks every few seconds, and Starlette's pool is shared with the deliveries' writes)."""

    def __init__(self, check: Callable[[], bool]) -> None:
        self._check = check
        self._running: asyncio.Future[bool] | None = None

    async def within(self, timeout_s: float) -> bool:
        """The check's answer, or False when it takes longer than ``timeout_s`` (it goes on)."""
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(run_in_threadpool(self._check))
        try:
            return await asyncio.wait_for(asyncio.shield(self._running), timeout=timeout_s)
        except TimeoutError:
            return False


def _store_takes_writes(sessions: sessionmaker[Session]) -> Callable[[], bool]:
    """The store would take a delivery's write now (:func:`takes_writes`), its lock waited for a
    little less than readiness's own bound, so that the thread ends with the answer."""
    lock_timeout_ms = int(READY_CHECK_TIMEOUT_S * 1000 * 0.75)

    def check() -> bool:
        try:
            with sessions() as session:
                try:
                    return takes_writes(session, lock_timeout_ms=lock_timeout_ms)
                finally:
                    session.rollback()
        except SQLAlchemyError:
            return False
    return check


def _broker_answers(publish: Publish) -> Callable[[], bool]:
    answers = getattr(publish, "broker_answers", None)
    return answers if callable(answers) else (lambda: True)  # a publisher without a broker: nothing to ask


def _hand_over(publish: Publish, delivery: NewDelivery) -> None:
    hand_over = getattr(publish, "publish_unrecorded", None)
    if hand_over is None:
        return
    try:
        hand_over([delivery])
    except Exception as error:  # the broker is away too: the scheduled read-backs still come
        log.warning("could not hand webhook delivery %s to the consumer: %s", delivery.delivery_id, type(error).__name__)


def _publish(publish: Publish, rows: dict[str, int]) -> None:
    """Publish new row IDs, in one batch when the publisher has ``publish_many``. A broker failure
    never fails the answer: those rows stay unprocessed and the tracking sweep sends them."""
    publish_many = getattr(publish, "publish_many", None)
    groups = [list(rows.items())] if publish_many else [[item] for item in rows.items()]
    for group in groups:
        if not group:
            continue
        try:
            if publish_many:
                publish_many([row_id for _, row_id in group])
            else:
                publish(group[0][1])
        except Exception as error:
            log.warning("could not publish webhook deliveries %s: %s; the sweep will",
                        ", ".join(delivery_id for delivery_id, _ in group), type(error).__name__)


def _refusal(reason: str, status_code: int) -> Response:
    return Response(json.dumps({"error": reason}).encode(), status_code=status_code, media_type="application/json")
