"""The delivery latency by route (``dispatcher_delivery_latency_seconds``): each message once, from
the workspace accepting it to its first report of delivered or read, observed only once the
transaction that recorded it committed, and from what the outcome read anyway (the attempt's
acceptance and route: no statement of its own); real sends to a sandbox process, a SQLite and a PostgreSQL store."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.metrics import DELIVERY_LATENCY, render
from dispatcher.tracking import outcomes
from dispatcher.tracking.reconcile import process_deliveries
from tests.integration.tracking.test_tracking import FAST, _recorded, _send
from tests.support.dispatcher_setup import example_settings, reminder, send_context
from tests.support.sandbox_process import SandboxProcess, running_sandbox

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with running_sandbox(FAST) as process:
        yield process


@pytest.fixture(params=["sqlite", "postgresql"])
def context(request: pytest.FixtureRequest, sandbox: SandboxProcess, tmp_path: Path,
            clean_environment: pytest.MonkeyPatch) -> Iterator[SendContext]:
    sandbox.reset()
    database_url = (f"sqlite:///{tmp_path}/latency.sqlite" if request.param == "sqlite"
                    else request.getfixturevalue("fresh_postgres_url"))
    with send_context(example_settings(api_url=sandbox.base_url, database_url=database_url)) as ctx:
        ctx.enqueuer = ListEnqueuer()
        yield ctx


def _observed(route: str) -> tuple[float, float]:
    """How many deliveries of ``route`` the histogram holds, and their seconds in all."""
    labels = {"route": route}
    return (REGISTRY.get_sample_value("dispatcher_delivery_latency_seconds_count", labels) or 0.0,
            REGISTRY.get_sample_value("dispatcher_delivery_latency_seconds_sum", labels) or 0.0)


def _message_of(ctx: SendContext, event_id: str) -> int:
    message_id = intake.status(ctx.sessions, event_id).message_id
    assert message_id is not None
    return message_id


def test_a_message_is_observed_once_when_first_delivered_and_never_when_it_fails(context: SendContext) -> None:
    _send(context, reminder("latency-1", identifier="latency-p1", phone="+15550470001"))
    _send(context, reminder("latency-2", identifier="latency-p2", phone="+15550470002", route="sms"))
    (reminders, reminders_s), (sms, _) = _observed("reminders"), _observed("sms")
    message = _message_of(context, "latency-1")
    assert outcomes.apply_outcome(outcomes.Outcome(message, "delivered", None), context,
                                  context.enqueuer) == "applied_delivered"
    count, seconds = _observed("reminders")
    assert count == reminders + 1
    assert 0.0 <= seconds - reminders_s < 60.0  # from the acceptance a moment ago
    # read after delivered: the message was delivered already, and it is not observed again
    assert outcomes.apply_outcome(outcomes.Outcome(message, "read", None), context, context.enqueuer) == "applied_read"
    assert _observed("reminders")[0] == reminders + 1
    # a failure is no delivery (the fallbacks decided count those)
    assert outcomes.apply_outcome(outcomes.Outcome(_message_of(context, "latency-2"), "failed", "30003"), context,
                                  context.enqueuer) == "no_fallback"
    assert _observed("sms")[0] == sms


def test_a_group_of_deliveries_observes_each_message_once(context: SendContext) -> None:
    """The consumer applies a group in one transaction; a message delivered, then read in the same
    group is observed once."""
    for n in range(3):
        _send(context, reminder(f"latency-g{n}", identifier=f"latency-pg{n}", phone=f"+1555047010{n}"))
    before = _observed("reminders")[0]
    messages = [_message_of(context, f"latency-g{n}") for n in range(3)]
    rows = _recorded(
        context,
        ("g-0", {"event": "message_updated", "message_id": messages[0], "status": "delivered"}),
        ("g-1", {"event": "message_updated", "message_id": messages[1], "status": "delivered"}),
        ("g-1-read", {"event": "message_updated", "message_id": messages[1], "status": "read"}),
        ("g-2", {"event": "message_updated", "message_id": messages[2], "status": "read"}),
    )
    assert process_deliveries(rows, context, context.enqueuer).words == {"applied_delivered": 2, "applied_read": 2}
    assert _observed("reminders")[0] == before + 3


def test_a_group_whose_transaction_fails_observes_nothing(context: SendContext, monkeypatch: pytest.MonkeyPatch) -> None:
    _send(context, reminder("latency-rb", identifier="latency-prb", phone="+15550470003"))
    before = _observed("reminders")[0]
    message = _message_of(context, "latency-rb")

    def refuse(*_: object, **__: object) -> None:
        raise RuntimeError("the transaction ends without its commit")

    monkeypatch.setattr(outcomes.store, "drop_payloads_of_current", refuse)
    with pytest.raises(RuntimeError):
        outcomes.apply_outcome(outcomes.Outcome(message, "delivered", None), context, context.enqueuer)
    assert _observed("reminders")[0] == before
    assert intake.status(context.sessions, "latency-rb").state in ("accepted", "sent")  # rolled back


def test_the_histogram_names_the_route_and_nothing_else() -> None:
    DELIVERY_LATENCY.labels(route="reminders").observe(42.0)
    text = render().decode()
    assert re.search(r'^dispatcher_delivery_latency_seconds_bucket\{le="60.0",route="reminders"\} [1-9]', text, re.MULTILINE)
    labels = set(re.findall(r"^dispatcher_delivery_latency_seconds_\w+\{([^}]*)\}", text, re.MULTILINE))
    assert labels and all(set(re.findall(r'(\w+)="', pairs)) <= {"route", "le"} for pairs in labels)
