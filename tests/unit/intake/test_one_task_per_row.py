"""One task per waiting row (issue 44): the sweep publishes a row again only when its task cannot
be anywhere, never because it waited long in a backlog.

SQLite store; a FIFO list in place of the broker's send queue, whose depth the sweep reads; the
sweep's clock is moved past several ``stale_after_s`` periods (the setting stays at its default).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake import outbox
from dispatcher.intake.request import parse_request
from dispatcher.operations.sweep import sweep
from dispatcher.policy.fallback import Failure
from dispatcher.queues import SEND_QUEUE
from dispatcher.sending import send
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings
from dispatcher.store import queries as store
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Notification
from dispatcher.tracking import outcomes
from tests.support.dispatcher_setup import example_settings, reminder, send_context

STALE_S = Settings.model_fields["stale_after_s"].default
ROWS = 6


class Queue(ListEnqueuer):
    """The broker's send queue: first in, first out; a worker takes from the head; a restart
    without persistence empties it. ``sent`` keeps every publish."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[int] = []
        self.depth_reads = 0

    def enqueue_send(self, notification_ids: Iterable[int], *, queue: str = SEND_QUEUE) -> list[int]:
        published = super().enqueue_send(notification_ids, queue=queue)
        self.waiting += published
        return published

    def send_queue_depth(self) -> int:
        self.depth_reads += 1
        return len(self.waiting)

    def take(self) -> int:
        return self.waiting.pop(0)

    def restart(self) -> None:
        self.waiting.clear()


class Died(BaseException):
    """The publishing process died here (a SIGKILL): no code of ours catches a BaseException."""


class DiesBeforePublishing(ListEnqueuer):
    def enqueue_send(self, notification_ids: Iterable[int], *, queue: str = SEND_QUEUE) -> list[int]:
        raise Died()


@pytest.fixture()
def settings(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Settings:
    url = f"sqlite:///{tmp_path}/store.sqlite"
    upgrade_database(url)
    return example_settings(api_url="http://127.0.0.1:9", database_url=url)


@pytest.fixture()
def queue() -> Queue:
    return Queue()


@pytest.fixture()
def dispatcher(settings: Settings, queue: Queue) -> Iterator[Dispatcher]:
    yield Dispatcher(settings, enqueuer=queue)


def _hand_over(dispatcher: Dispatcher, count: int, prefix: str = "evt") -> list[int]:
    ids = []
    for number in range(count):
        dispatcher.notify(reminder(f"{prefix}-{number}", identifier=f"patient-{number}", phone="+15550300000"))
        with dispatcher.sessions() as session:
            found = store.find_notification_by_event(session, f"{prefix}-{number}")
            assert found is not None
            ids.append(found.id)
    return ids


def _sweeps(dispatcher: Dispatcher, queue: ListEnqueuer, start: datetime, *, periods: int,
            step_s: float = 10.0) -> int:
    """Sweeps every ``step_s`` of the sweep's clock for ``periods`` stale periods; how many tasks they published."""
    published = 0
    for step in range(1, int(periods * STALE_S / step_s) + 1):
        moment = start + timedelta(seconds=step * step_s)
        published += sweep(sessions=dispatcher.sessions, enqueuer=queue, stale_after_s=STALE_S, clock=lambda: moment)
    return published


def _at(moment: datetime) -> Callable[[], datetime]:
    return lambda: moment


def test_the_default_lease_is_45_seconds() -> None:
    assert STALE_S == 45.0  # the behaviour below is at the default, not a shortened timer


def test_a_row_waiting_in_a_backlog_keeps_its_one_task(dispatcher: Dispatcher, queue: Queue) -> None:
    ids = _hand_over(dispatcher, ROWS)
    start = datetime.now(UTC)
    assert _sweeps(dispatcher, queue, start, periods=6) == 0  # no worker takes any: still one task each
    assert Counter(queue.waiting) == dict.fromkeys(ids, 1)
    assert queue.depth_reads == 6 * 45 // 10  # once a sweep


def test_after_the_broker_lost_its_queue_each_lost_row_is_published_exactly_once_more(
        dispatcher: Dispatcher, queue: Queue) -> None:
    ids = _hand_over(dispatcher, ROWS)
    queue.restart()  # Redis killed and started empty: every queued task is gone
    start = datetime.now(UTC)
    assert _sweeps(dispatcher, queue, start, periods=6) == ROWS
    assert Counter(queue.sent) == dict.fromkeys(ids, 2)
    assert Counter(queue.waiting) == dict.fromkeys(ids, 1)


def test_a_lost_row_is_not_published_before_stale_after_s(dispatcher: Dispatcher, queue: Queue) -> None:
    [row] = _hand_over(dispatcher, 1)
    queue.restart()
    start = datetime.now(UTC)
    assert sweep(sessions=dispatcher.sessions, enqueuer=queue, stale_after_s=STALE_S,
                 clock=_at(start + timedelta(seconds=STALE_S - 2))) == 0
    assert sweep(sessions=dispatcher.sessions, enqueuer=queue, stale_after_s=STALE_S,
                 clock=_at(start + timedelta(seconds=STALE_S + 1))) == 1
    assert queue.waiting == [row]


def _accept_dying(settings: Settings, queue: Queue, event_id: str) -> None:
    with pytest.raises(Died):
        intake.accept(parse_request(reminder(event_id, identifier="p-dies", phone="+15550300001")),
                      sessions=Dispatcher(settings, enqueuer=queue).sessions, settings=settings,
                      enqueuer=DiesBeforePublishing())


def _relay_dying(settings: Settings, queue: Queue, event_id: str) -> None:
    dispatcher = Dispatcher(settings, enqueuer=queue)
    with dispatcher.sessions.begin() as session:
        outbox.add(session, reminder(event_id, identifier="p-dies", phone="+15550300001"), settings=settings)
    with pytest.raises(Died):
        sweep(sessions=dispatcher.sessions, enqueuer=_Dying(), stale_after_s=STALE_S)


def _decision_dying(settings: Settings, queue: Queue, event_id: str) -> None:
    dispatcher = Dispatcher(settings, enqueuer=ListEnqueuer())  # its first task ran, long ago
    dispatcher.notify(reminder(event_id, identifier="p-dies", phone="+15550300001"))
    with dispatcher.sessions() as session:
        found = store.find_notification_by_event(session, event_id)
        assert found is not None
    with send_context(settings) as context, pytest.raises(Died):
        outcomes.settle_failure(found.id, Failure(purpose="first", error_kind="external_error",
                                                  detail="131026 (#131026) Message undeliverable"),
                                context, DiesBeforePublishing())


class _Dying(DiesBeforePublishing):
    def send_queue_depth(self) -> int:
        return 0


@pytest.mark.parametrize("publisher", [_accept_dying, _relay_dying, _decision_dying],
                         ids=["intake", "relay", "fallback decision"])
def test_a_row_whose_publisher_died_after_its_commit_is_published_once_the_queue_has_drained(
        settings: Settings, dispatcher: Dispatcher, queue: Queue, publisher: Any) -> None:
    # Given a backlog whose tasks wait in the queue, and a row marked enqueued whose publish never happened
    backlog = _hand_over(dispatcher, ROWS)
    publisher(settings, queue, "evt-orphan")
    with dispatcher.sessions() as session:
        orphan = store.find_notification_by_event(session, "evt-orphan")
        assert orphan is not None and orphan.enqueued_at is not None and not orphan.task_started
    start = datetime.now(UTC)
    # While the backlog waits, its task may be in the queue as far as the sweep can tell: left
    assert _sweeps(dispatcher, queue, start, periods=3) == 0
    # Once workers have taken the backlog (each run touches its row, then waits a day: a long wait
    # the sweep keeps, not a lease), the orphan is published, once
    with dispatcher.sessions.begin() as session:
        for _ in backlog:
            taken = queue.take()
            store.touch_for_run(session, taken, now=start + timedelta(seconds=3 * STALE_S))
            store.defer(session, taken, at=start + timedelta(days=1))
    later = start + timedelta(seconds=3 * STALE_S + 1)
    assert sweep(sessions=dispatcher.sessions, enqueuer=queue, stale_after_s=STALE_S, clock=_at(later)) == 1
    assert queue.waiting == [orphan.id]
    assert _sweeps(dispatcher, queue, later, periods=3, step_s=STALE_S / 2) == 0  # its task waits: nothing more
    assert Counter(queue.sent)[orphan.id] == 1


def test_a_run_that_ended_by_an_exception_is_published_again_when_its_lease_lapses_behind_a_backlog(
        settings: Settings, dispatcher: Dispatcher, queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a backlog waiting in the queue, and a worker that takes the first row's task
    first, *rest = _hand_over(dispatcher, ROWS)
    assert queue.take() == first

    def bug(*_args: Any) -> None:
        raise RuntimeError("a bug")

    # When its run touches the row and then ends by an exception (Celery acknowledges the task)
    monkeypatch.setattr(send, "_run_job", bug)
    with send_context(settings) as context, pytest.raises(RuntimeError):
        monkeypatch.setattr(context.inboxes, "warm", lambda: None)  # no workspace here: the inboxes are not needed
        send.send_notification(first, context)
    with dispatcher.sessions() as session:
        row = session.get(Notification, first)
        assert row is not None and row.task_started and row.enqueued_at is not None
        touched = row.enqueued_at
    # Then the sweep leaves it while the run's lease holds, and publishes it once the lease lapsed,
    # although the queue is not empty (a started task is in no queue)
    assert sweep(sessions=dispatcher.sessions, enqueuer=queue, stale_after_s=STALE_S,
                 clock=_at(touched + timedelta(seconds=STALE_S - 1))) == 0
    later = touched + timedelta(seconds=STALE_S + 1)
    assert sweep(sessions=dispatcher.sessions, enqueuer=queue, stale_after_s=STALE_S, clock=_at(later)) == 1
    assert queue.waiting == [*rest, first]
    # and its new task is a queued one: not published again while the backlog waits
    assert _sweeps(dispatcher, queue, later, periods=4) == 0


def test_a_countdown_retry_is_a_queued_task(dispatcher: Dispatcher, queue: Queue) -> None:
    first, *rest = _hand_over(dispatcher, ROWS)
    assert queue.take() == first
    now = datetime.now(UTC)
    with dispatcher.sessions.begin() as session:  # its run retries with a 200 s countdown: the retry is queued
        store.touch_for_run(session, first, now=now)
        store.expect_run(session, first, at=now + timedelta(seconds=200))
    queue.enqueue_send([first])
    # behind a backlog, never again
    assert _sweeps(dispatcher, queue, now, periods=12) == 0
    # once the queue is empty (its worker holds the retry's message until it is due, or it was
    # lost), only past its due time: the rest of the backlog's tasks were lost with it, at once
    queue.restart()
    assert sweep(sessions=dispatcher.sessions, enqueuer=queue, stale_after_s=STALE_S,
                 clock=_at(now + timedelta(seconds=200 + STALE_S - 1))) == len(rest)
    assert first not in queue.waiting
    queue.restart()  # (the others' new tasks lost too: published 2 s ago, not stale yet)
    assert sweep(sessions=dispatcher.sessions, enqueuer=queue, stale_after_s=STALE_S,
                 clock=_at(now + timedelta(seconds=200 + STALE_S + 1))) == 1
    assert queue.waiting == [first]


def test_a_broker_that_cannot_tell_its_depth_leaves_the_sweep_judging_by_age(dispatcher: Dispatcher) -> None:
    # (what every sweep did before issue 44; a twin task is harmless, a lost one is not)
    blind = ListEnqueuer(queue_depth=None)
    dispatcher.enqueuer = blind
    [row] = _hand_over(dispatcher, 1)
    later = datetime.now(UTC) + timedelta(seconds=STALE_S + 1)
    assert sweep(sessions=dispatcher.sessions, enqueuer=blind, stale_after_s=STALE_S, clock=_at(later)) == 1
    assert blind.sent == [row, row]
