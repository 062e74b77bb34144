"""Prometheus metrics: what operators watch besides Flower.

Labels carry kinds, states, verdicts and operation names only: never IDs, phones or content.
Counters and histograms live in the process that observes them; Celery's prefork children write
them to files under ``PROMETHEUS_MULTIPROC_DIR`` (set by ``dispatcher worker`` before the
children start) and the worker's main process serves the sum (:func:`serve_worker_metrics`).
The number of notifications by state is read from the store at scrape time, and so is what holds
across processes: each workspace's circuit breaker (where the workers share it, in Redis) and the
callback URLs paused. The configured routes' delivery deadlines are exported beside the delivery
latency, so an alert compares one with the other (deploy/prometheus/alerts.yml).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from dispatcher.policy.breaker import Breaker
    from dispatcher.settings import Route, Settings

SEND_LATENCY = Histogram(
    "dispatcher_send_latency_seconds",
    "From intake (the notification stored) to the workspace accepting the message.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
SEND_RESULTS = Counter("dispatcher_send_results_total", "Runs of the send task by result.", ["result"])
API_ERRORS = Counter("dispatcher_api_errors_total", "Workspace API errors by kind and operation.", ["kind", "operation"])
WORKSPACE_PAUSES = Counter(
    "dispatcher_workspace_pauses_total",
    "Times every worker stopped calling the workspace (the circuit breaker opened), by reason: auth, unreachable.",
    ["reason"],
)
WEBHOOK_VERDICTS = Counter("dispatcher_webhook_verdicts_total", "Webhook deliveries by verdict.", ["verdict"])
FALLBACK_DECISIONS = Counter("dispatcher_fallback_decisions_total", "Single fallback decisions taken.", ["decision"])
OUTCOMES = Counter("dispatcher_outcomes_total", "Webhook outcomes applied, by result.", ["result"])
RECIPIENT_REFUSALS = Counter("dispatcher_recipient_refusals_total",
                             "Notifications ended unsent because the recipient opted out or gave no consent.", ["reason"])
OPT_OUTS = Counter("dispatcher_opt_outs_total", "Opt-outs and opt-ins recorded, by source.", ["change", "source"])
# Around the routes' delivery deadlines (900 s by default) and well past them: an alert compares
# the p99 with each route's deadline, which counts from the same moment (the acceptance).
DELIVERY_LATENCY = Histogram(
    "dispatcher_delivery_latency_seconds",
    "From the workspace accepting a message to its first report of delivered or read, by the attempt's route.",
    ["route"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 21600, 86400),
)

__all__ = [
    "API_ERRORS", "CONTENT_TYPE_LATEST", "FALLBACK_DECISIONS", "OPT_OUTS", "OUTCOMES", "RECIPIENT_REFUSALS", "SEND_LATENCY", "SEND_RESULTS",
    "DELIVERY_LATENCY", "WEBHOOK_VERDICTS", "NotificationStates", "RouteDeadlines", "WorkspaceBreakers", "deployment_collectors",
    "render", "serve_worker_metrics",
]


class NotificationStates(Collector):
    """``dispatcher_notifications{state}``, ``dispatcher_notifications_set_aside`` (their send task
    kept dying: ``crash_loop``, for ``dispatcher retry``), ``dispatcher_webhook_deliveries_set_aside``
    and ``dispatcher_callback_urls_paused`` (a host's callback URL failed every delivery for
    ``callback_pause_after_s``, for ``dispatcher callbacks retry``): counted in the store when scraped."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from dispatcher.lifecycle.overview import state_counts  # at the first scrape: not every process that counts reads the store

        family = GaugeMetricFamily("dispatcher_notifications", "Notifications in the store by state.", labels=["state"])
        crash_loops = GaugeMetricFamily("dispatcher_notifications_set_aside",
                                        "Notifications set aside as crash_loop: their send task kept dying (dispatcher retry).")
        set_aside = GaugeMetricFamily("dispatcher_webhook_deliveries_set_aside",
                                      "Webhook deliveries the consumer set aside (dispatcher deliveries list).")
        paused_urls = GaugeMetricFamily("dispatcher_callback_urls_paused",
                                        "Callback URLs paused: they failed every delivery (dispatcher callbacks retry).")
        store_up = GaugeMetricFamily("dispatcher_store_up", "1 when the store answered this scrape, else 0.")
        try:
            with self._sessions() as session:
                counts = state_counts(session)
            for state, count in counts.by_state:
                family.add_metric([state], count)
            crash_loops.add_metric([], counts.crash_loops)
            set_aside.add_metric([], counts.deliveries_set_aside)
            paused_urls.add_metric([], counts.callback_urls_paused)
        except SQLAlchemyError:  # the process's own metrics still answer while the store is away
            store_up.add_metric([], 0)
            yield store_up
            return
        store_up.add_metric([], 1)
        yield store_up
        yield family
        yield crash_loops
        yield set_aside
        yield paused_urls


class WorkspaceBreakers(Collector):
    """``dispatcher_workspace_paused{workspace,reason}``: 1 while the workspace's circuit breaker is
    open (every worker waits: ``auth``, ``unreachable``, ``unavailable``), else 0 with no reason.
    Read when scraped from the breaker the workers share (Redis), without taking its probe, so any
    process that can read it says the same; a breaker that does not answer gives no sample."""

    def __init__(self, breakers: Mapping[str, Breaker]) -> None:
        self._breakers = breakers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from redis.exceptions import RedisError

        family = GaugeMetricFamily("dispatcher_workspace_paused",
                                   "1 while the workspace's circuit breaker holds every worker back, by reason.",
                                   labels=["workspace", "reason"])
        for name, breaker in sorted(self._breakers.items()):
            try:
                pause = breaker.peek()
            except RedisError:  # unknown is not closed: no sample rather than a 0 that reassures
                continue
            family.add_metric([name, pause.reason if pause else ""], 1 if pause else 0)
        yield family


class RouteDeadlines(Collector):
    """``dispatcher_route_delivery_deadline_seconds{route}``: each configured route's
    ``delivery_deadline_s``, so a rule compares the delivery latency's p99 with it."""

    def __init__(self, routes: Mapping[str, Route]) -> None:
        self._routes = routes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("dispatcher_route_delivery_deadline_seconds",
                                   "The route's delivery deadline (delivery_deadline_s), from the configuration.",
                                   labels=["route"])
        for name, route in sorted(self._routes.items()):
            family.add_metric([name], route.delivery_deadline_s)
        yield family


def deployment_collectors(settings: Settings) -> list[Collector]:
    """What a process reads of the deployment at scrape time besides the store: the routes'
    deadlines, and each workspace's breaker where the workers share it (Redis; in the embedded
    setup each process has a breaker of its own, which no other process can read). A scrape waits
    a second at most for Redis."""
    collectors: list[Collector] = [RouteDeadlines(settings.routes)]
    if settings.limiter_redis_url is not None:
        from dispatcher.context import make_breaker

        collectors.append(WorkspaceBreakers({name: make_breaker(settings.for_workspace(name), timeout_s=1.0)
                                             for name in settings.workspace_names}))
    return collectors


def render(*extra: Collector) -> bytes:
    """This process's metrics, plus extra collectors, in the Prometheus text format."""
    registry = CollectorRegistry()
    for collector in (REGISTRY, *extra):
        registry.register(collector)
    return generate_latest(registry)


def serve_worker_metrics(port: int, *, host: str, sessions: sessionmaker[Session] | None = None,
                         collectors: Sequence[Collector] = ()) -> None:
    """Serve the worker's metrics, summed over its prefork children, on ``host:port``, with
    ``collectors`` read at each scrape."""
    from prometheus_client import multiprocess, start_http_server

    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(REGISTRY)
    if sessions is not None:
        registry.register(NotificationStates(sessions))
    for collector in collectors:
        registry.register(collector)
    start_http_server(port, addr=host, registry=registry)
