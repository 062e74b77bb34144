"""Opt-in OpenTelemetry traces: one trace per notification, exported with OTLP (docs/tracing.md).

A notification's trace starts when it is handed over: its root span's W3C ``traceparent`` is
stored on the notification's row (``trace_parent``), and every process that later works on it
continues that trace from the row: each run of the send task (with a span per workspace API
call inside it), and each outcome applied, whether a webhook or a read-back brought it. The row,
not the broker's task headers, carries the context, because the sweep publishes tasks outside
any span and a workspace's webhooks carry none.

Off unless ``otlp_endpoint`` is set (or a test hands in an exporter): every function here is then
a no-op that costs a global lookup, and nothing of OpenTelemetry is imported. Span attributes are
our identifiers, names, states and error kinds only (:data:`ATTRIBUTES`): never content, contact
data or a URL (a contact search carries the phone number in its query string).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

    from dispatcher.settings import Operators

# The attribute names a span may carry; anything else is dropped, so a careless call cannot leak.
ATTRIBUTES = frozenset({
    "dispatcher.notification_id", "dispatcher.route", "dispatcher.channel", "dispatcher.workspace",
    "dispatcher.state", "dispatcher.attempt", "dispatcher.outcome", "dispatcher.error_kind", "dispatcher.status",
    "dispatcher.operation", "dispatcher.message_id", "http.response.status_code",
})

_tracer: Tracer | None = None
_provider: Any = None  # the SDK's TracerProvider while tracing is on: flushed by shutdown()


def check_available(operators: Operators) -> None:
    """ConfigurationError, naming the setting, when ``otlp_endpoint`` is set and the tracing
    packages are not installed: said at start, in one line, not in every worker's log."""
    if operators.otlp_endpoint is None:
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        from dispatcher.errors import ConfigurationError

        raise ConfigurationError("DISPATCHER_OTLP_ENDPOINT (otlp_endpoint)", "needs the tracing packages: pip "
                                 "install 'notification-dispatcher[tracing]'") from None


def configure(operators: Operators, *, service: str, exporter: SpanExporter | None = None) -> bool:
    """Turn tracing on in this process when ``operators.otlp_endpoint`` is set, or ``exporter`` is
    given (tests: the SDK's in-memory exporter, spans exported as they end). True when on."""
    global _tracer, _provider
    if exporter is None and operators.otlp_endpoint is None:
        return False
    check_available(operators)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=operators.otlp_endpoint)))
    _tracer, _provider = provider.get_tracer("dispatcher"), provider
    return True


def shutdown() -> None:
    """Export what the batch still holds and stop (a prefork child leaves with os._exit, so no
    exit hook would run): tracing is off afterwards."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer, _provider = None, None


def disable() -> None:
    """Tracing off again (tests)."""
    shutdown()


def enabled() -> bool:
    return _tracer is not None


def start_trace(name: str, attributes: Mapping[str, Any]) -> str | None:
    """A new notification's trace: its root span (ended at once: the hand-over) and the
    ``traceparent`` to store on its row; None while tracing is off."""
    if _tracer is None:
        return None
    from opentelemetry import context as otel_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    span = _tracer.start_span(name, context=otel_context.Context(), attributes=_allowed(attributes))
    span.end()
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=_context_of(span))
    return carrier.get("traceparent")


@contextmanager
def continued(trace_parent: str | None, name: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
    """A span in the notification's trace (``trace_parent`` from its row) around the block; the
    block's own spans (:func:`child`) nest in it. Yields the span; None (and nothing recorded)
    while tracing is off or the row has none."""
    if _tracer is None or trace_parent is None:
        yield None
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract({"traceparent": trace_parent})
    with _tracer.start_as_current_span(name, context=parent, attributes=_allowed(attributes),
                                       record_exception=False, set_status_on_exception=False) as span, _failing(span):
        yield span


@contextmanager
def child(name: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
    """A span inside the current one (a workspace API call in a send run); nothing outside any
    (an inbox listing at start-up is no notification's). Yields the span, or None."""
    if _tracer is None:
        yield None
        return
    from opentelemetry import trace

    if not trace.get_current_span().is_recording():
        yield None
        return
    with _tracer.start_as_current_span(name, attributes=_allowed(attributes), record_exception=False,
                                       set_status_on_exception=False) as span, _failing(span):
        yield span


def mark(trace_parent: str | None, name: str, attributes: Mapping[str, Any]) -> None:
    """A step in the notification's trace, as it happens (an outcome applied): a span of no length."""
    if _tracer is None or trace_parent is None:
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract({"traceparent": trace_parent})
    _tracer.start_span(name, context=parent, attributes=_allowed(attributes)).end()


@contextmanager
def _failing(span: Any) -> Iterator[None]:
    """An exception marks the span failed with its class name only: an exception's text may quote
    a URL (an HTTP error names the request's, query string and all), so it is never recorded."""
    try:
        yield
    except BaseException as error:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        raise


def set_attribute(span: Any, key: str, value: str | int) -> None:
    if span is not None and key in ATTRIBUTES:
        span.set_attribute(key, value)


def _allowed(attributes: Mapping[str, Any]) -> dict[str, str | int]:
    return {key: value for key, value in attributes.items()
            if key in ATTRIBUTES and isinstance(value, str | int) and not isinstance(value, bool)}


def _context_of(span: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(span)
