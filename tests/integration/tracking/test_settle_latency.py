"""The settle latency: each notification told once, by route, when it settles (delivered, read or
failed), and only once its transaction committed; real sends to a sandbox process, a SQLite and a
PostgreSQL store."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.lifecycle import moves, settles
from dispatcher.lifecycle.settles import Settled
from dispatcher.lifecycle.states import AttemptState
from dispatcher.metrics import observe_settle, render
from dispatcher.store import queries as store
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
    database_url = (f"sqlite:///{tmp_path}/settles.sqlite" if request.param == "sqlite"
                    else request.getfixturevalue("fresh_postgres_url"))
    with send_context(example_settings(api_url=sandbox.base_url, database_url=database_url)) as ctx:
        ctx.enqueuer = ListEnqueuer()
        yield ctx


def _message_of(ctx: SendContext, event_id: str) -> int:
    message_id = intake.status(ctx.sessions, event_id).message_id
    assert message_id is not None
    return message_id


def test_a_notification_is_told_once_when_delivered_and_when_it_fails_without_fallback(context: SendContext) -> None:
    told: list[Settled] = []
    settles.measure_settles(context.sessions, told.append)
    _send(context, reminder("settle-1", identifier="settle-p1", phone="+15550470001"))
    _send(context, reminder("settle-2", identifier="settle-p2", phone="+15550470002", route="sms"))
    assert told == []  # accepted is not settled
    delivered = outcomes.apply_outcome(outcomes.Outcome(_message_of(context, "settle-1"), "delivered", None), context,
                                       context.enqueuer)
    assert delivered == "applied_delivered"
    assert [(one.route, one.state) for one in told] == [("reminders", "delivered")]
    assert 0.0 <= told[0].seconds < 60.0
    # read after delivered moves nothing further: a notification settles once
    assert outcomes.apply_outcome(outcomes.Outcome(_message_of(context, "settle-1"), "read", None), context,
                                  context.enqueuer) == "applied_read"
    assert len(told) == 1
    # an SMS route has no fallback: its failure ends the notification, which settles failed
    failed = outcomes.apply_outcome(outcomes.Outcome(_message_of(context, "settle-2"), "failed", "30003"), context,
                                    context.enqueuer)
    assert failed == "no_fallback"
    assert [(one.route, one.state) for one in told] == [("reminders", "delivered"), ("sms", "failed")]


def test_a_group_of_deliveries_tells_each_notification_it_settles_once(context: SendContext) -> None:
    """The consumer applies a group in one transaction, each kind of move as one executemany."""
    told: list[Settled] = []
    settles.measure_settles(context.sessions, told.append)
    for n in range(3):
        _send(context, reminder(f"settle-g{n}", identifier=f"settle-pg{n}", phone=f"+1555047010{n}"))
    messages = [_message_of(context, f"settle-g{n}") for n in range(3)]
    rows = _recorded(
        context,
        ("g-0", {"event": "message_updated", "message_id": messages[0], "status": "delivered"}),
        ("g-1", {"event": "message_updated", "message_id": messages[1], "status": "delivered"}),
        ("g-1-read", {"event": "message_updated", "message_id": messages[1], "status": "read"}),
        ("g-2", {"event": "message_updated", "message_id": messages[2], "status": "read"}),
    )
    assert process_deliveries(rows, context, context.enqueuer).words == {"applied_delivered": 2, "applied_read": 2}
    # once each, in the state its transaction committed (g-1 was delivered, then read, in the group)
    assert sorted((one.route, one.state) for one in told) == [("reminders", "delivered")] + [("reminders", "read")] * 2


def test_a_move_rolled_back_tells_nothing(context: SendContext) -> None:
    told: list[Settled] = []
    settles.measure_settles(context.sessions, told.append)
    notification_id = _send(context, reminder("settle-rb", identifier="settle-prb", phone="+15550470003"))
    with pytest.raises(RuntimeError), context.sessions.begin() as session:
        read = store.attempts_for_outcomes(session, context.settings.workspace_name, [_message_of(context, "settle-rb")])
        [row] = read.values()
        assert moves.record_outcome(session, notification_id=notification_id, attempt_id=row.id, attempt_number=row.number,
                                    current=AttemptState(row.state), new=AttemptState.DELIVERED, external_error=None,
                                    now=context.clock())
        raise RuntimeError("the transaction ends without its commit")
    assert told == []
    assert intake.status(context.sessions, "settle-rb").state in ("accepted", "sent")  # not delivered: rolled back


def test_the_histogram_names_the_route_and_nothing_else() -> None:
    observe_settle(Settled(route="reminders", state="delivered", seconds=42.0))
    text = render().decode()
    assert re.search(r'^dispatcher_settle_latency_seconds_bucket\{le="60.0",route="reminders"\} [1-9]', text, re.MULTILINE)
    labels = set(re.findall(r"^dispatcher_settle_latency_seconds_\w+\{([^}]*)\}", text, re.MULTILINE))
    assert labels and all(set(re.findall(r'(\w+)="', pairs)) <= {"route", "le"} for pairs in labels)
