"""Prometheus metrics: what operators watch besides Flower.

Labels carry kinds, states, verdicts and operation names only: never IDs, phones or content.
Counters and histograms live in the process that observes them; Celery's prefork children write
them to files under ``PROMETHEUS_MULTIPROC_DIR`` (set by ``dispatcher worker`` before the
children start) and the worker's main process serves the sum (:func:`serve_worker_metrics`).
The number of notifications by state is read from the store at scrape time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

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

__all__ = [
    "API_ERRORS", "CONTENT_TYPE_LATEST", "FALLBACK_DECISIONS", "OPT_OUTS", "OUTCOMES", "RECIPIENT_REFUSALS", "SEND_LATENCY", "SEND_RESULTS",
    "WEBHOOK_VERDICTS", "NotificationStates", "render", "serve_worker_metrics",
]


class NotificationStates(Collector):
    """``dispatcher_notifications{state}``, ``dispatcher_notifications_set_aside`` (their send task
    kept dying: ``crash_loop``, for ``dispatcher retry``) and ``dispatcher_webhook_deliveries_set_aside``:
    counted in the store when scraped."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from dispatcher.lifecycle.overview import state_counts  # at the first scrape: not every process that counts reads the store

        family = GaugeMetricFamily("dispatcher_notifications", "Notifications in the store by state.", labels=["state"])
        crash_loops = GaugeMetricFamily("dispatcher_notifications_set_aside",
                                        "Notifications set aside as crash_loop: their send task kept dying (dispatcher retry).")
        set_aside = GaugeMetricFamily("dispatcher_webhook_deliveries_set_aside",
                                      "Webhook deliveries the consumer set aside (dispatcher deliveries list).")
        store_up = GaugeMetricFamily("dispatcher_store_up", "1 when the store answered this scrape, else 0.")
        try:
            with self._sessions() as session:
                counts = state_counts(session)
            for state, count in counts.by_state:
                family.add_metric([state], count)
            crash_loops.add_metric([], counts.crash_loops)
            set_aside.add_metric([], counts.deliveries_set_aside)
        except SQLAlchemyError:  # the process's own metrics still answer while the store is away
            store_up.add_metric([], 0)
            yield store_up
            return
        store_up.add_metric([], 1)
        yield store_up
        yield family
        yield crash_loops
        yield set_aside


def render(*extra: Collector) -> bytes:
    """This process's metrics, plus extra collectors, in the Prometheus text format."""
    registry = CollectorRegistry()
    for collector in (REGISTRY, *extra):
        registry.register(collector)
    return generate_latest(registry)


def serve_worker_metrics(port: int, *, host: str, sessions: sessionmaker[Session] | None = None) -> None:
    """Serve the worker's metrics, summed over its prefork children, on ``host:port``."""
    from prometheus_client import multiprocess, start_http_server

    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(REGISTRY)
    if sessions is not None:
        registry.register(NotificationStates(sessions))
    start_http_server(port, addr=host, registry=registry)
