"""Traces, with the OpenTelemetry SDK's in-memory exporter: one notification that fails on its
first route and is sent on its fallback, against the sandbox process, makes one trace. Its root
is the hand-over; each send run continues it from the stored traceparent, with a span per
workspace API call inside; the outcome applied later joins it too. No span carries content,
contact data or a URL, and a failed call's span says only the error's class."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dispatcher import tracing
from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.sending.send import Outcome
from dispatcher.store import queries as store
from dispatcher.tracking.outcomes import Outcome as Reported
from dispatcher.tracking.outcomes import apply_outcome
from tests.support.dispatcher_setup import drive, example_settings, reminder, send_context
from tests.support.sandbox_process import SandboxProcess, running_sandbox

pytestmark = pytest.mark.integration

PHONE = "+15550420001"
CONTENT = "Reminder evt-traced: your HIV test result is ready"
SERVER_ERRORS = {"createMessage": {"server_error_share": 1.0}}


@pytest.fixture()
def traced(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Iterator[tuple[SendContext, SandboxProcess,
                                                                                     InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    with running_sandbox() as sandbox:
        settings = example_settings(api_url=sandbox.base_url, database_url=f"sqlite:///{tmp_path}/traces.sqlite")
        assert tracing.configure(settings, service="dispatcher-test", exporter=exporter)
        try:
            with send_context(settings) as context:
                yield context, sandbox, exporter
        finally:
            tracing.disable()


def test_one_notification_makes_one_trace_without_content(
        traced: tuple[SendContext, SandboxProcess, InMemorySpanExporter]) -> None:
    context, sandbox, exporter = traced
    request = reminder("evt-traced", identifier="p-traced", phone=PHONE, content=CONTENT)
    intake.accept(parse_request(request), sessions=context.sessions, settings=context.settings, enqueuer=ListEnqueuer())
    with context.sessions() as session:
        found = store.find_notification_by_event(session, "evt-traced")
        assert found is not None and found.trace_parent is not None
        notification_id = found.id
    sandbox.set_faults(SERVER_ERRORS)
    drive(context, notification_id)  # the platform message fails: the SMS fallback is decided
    sandbox.set_faults({})
    assert drive(context, notification_id)[-1].outcome is Outcome.ACCEPTED
    record = intake.status(context.sessions, "evt-traced")
    assert record.message_id is not None
    assert apply_outcome(Reported(record.message_id, "delivered", None), context, None) == "applied_delivered"

    spans: list[ReadableSpan] = list(exporter.get_finished_spans())
    assert {span.context.trace_id for span in spans if span.context is not None} == {
        spans[0].context.trace_id if spans[0].context else 0}
    by_id = {span.context.span_id: span for span in spans if span.context is not None}
    [root] = [span for span in spans if span.parent is None]
    assert root.name == "dispatcher.notification" and root.attributes is not None
    assert root.attributes["dispatcher.route"] == "reminders"
    sends = [span for span in spans if span.name == "dispatcher.send"]
    assert len(sends) >= 2 and all(span.parent is not None and span.parent.span_id == root.context.span_id
                                   for span in sends if root.context is not None)
    calls = [span for span in spans if span.name.startswith("workspace ")]
    assert {"workspace createMessage", "workspace searchContacts"} <= {span.name for span in calls}
    assert all(span.parent is not None and by_id[span.parent.span_id].name == "dispatcher.send" for span in calls)
    failed_calls = [span for span in calls if not span.status.is_ok]
    assert failed_calls and {span.status.description for span in failed_calls} <= {"HTTPStatusError"}
    [applied] = [span for span in spans if span.name == "dispatcher.outcome"]
    assert applied.parent is not None and root.context is not None and applied.parent.span_id == root.context.span_id
    assert applied.attributes is not None and applied.attributes["dispatcher.state"] == "delivered"

    for span in spans:
        shown = " ".join([span.name, str(span.status.description or ""),
                          *(f"{key}={value}" for key, value in (span.attributes or {}).items()),
                          *(event.name for event in span.events)])
        assert PHONE not in shown and PHONE.removeprefix("+") not in shown and "HIV" not in shown, shown
        assert "http://" not in shown and "p-traced" not in shown, shown
        assert set(span.attributes or {}) <= tracing.ATTRIBUTES


def test_without_an_endpoint_nothing_is_traced_or_stored(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=f"sqlite:///{tmp_path}/off.sqlite")
    assert not tracing.configure(settings, service="dispatcher-test") and not tracing.enabled()
    with send_context(settings) as context:
        intake.accept(parse_request(reminder("evt-untraced", identifier="p-u", phone=PHONE)), sessions=context.sessions,
                      settings=settings, enqueuer=ListEnqueuer())
        with context.sessions() as session:
            found = store.find_notification_by_event(session, "evt-untraced")
            assert found is not None and found.trace_parent is None
