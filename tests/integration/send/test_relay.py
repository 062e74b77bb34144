"""The outbox relay (the beat sweep) on PostgreSQL: batch after batch within one sweep, disjoint
batches when several sweeps run at once, and a failed publish given back to the next sweep."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import outbox
from dispatcher.operations.sweep import BATCH, sweep
from dispatcher.queues import SEND_QUEUE
from dispatcher.store.db import session_factory, shared_engine
from dispatcher.store.migrate import upgrade_database
from tests.support.dispatcher_setup import example_settings, reminder

pytestmark = pytest.mark.integration

STAGED = 2 * BATCH + 137  # three batches, the last one short


@pytest.fixture()
def sessions(fresh_postgres_url: str, clean_environment: pytest.MonkeyPatch) -> Iterator[sessionmaker[Session]]:
    upgrade_database(fresh_postgres_url)
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=fresh_postgres_url)
    factory = session_factory(shared_engine(fresh_postgres_url))
    with factory.begin() as session:  # one host transaction stages them all, as an outbox host would
        for number in range(STAGED):
            outbox.add(session, reminder(f"relay-{number}", identifier=f"patient-{number}", phone="+15550300000"),
                       settings=settings)
    yield factory


class SlowBroker(ListEnqueuer):
    """Takes a while per batch, so that two sweeps' batches interleave."""

    def enqueue_send(self, notification_ids: Iterable[int], *, queue: str = SEND_QUEUE) -> list[int]:
        time.sleep(0.05)
        return super().enqueue_send(notification_ids, queue=queue)


def test_one_sweep_relays_every_batch(sessions: sessionmaker[Session]) -> None:
    broker = ListEnqueuer()
    assert sweep(sessions=sessions, enqueuer=broker, stale_after_s=300) == STAGED
    assert len(set(broker.sent)) == len(broker.sent) == STAGED
    assert sweep(sessions=sessions, enqueuer=broker, stale_after_s=300) == 0  # all taken


def test_sweeps_running_at_once_publish_disjoint_batches(sessions: sessionmaker[Session]) -> None:
    brokers = [SlowBroker() for _ in range(3)]
    start = threading.Barrier(len(brokers))

    def run(broker: SlowBroker) -> None:
        start.wait()
        while sweep(sessions=sessions, enqueuer=broker, stale_after_s=300, budget_s=0.0):
            pass  # one batch a call here, so every sweep keeps coming back for more

    threads = [threading.Thread(target=run, args=(broker,)) for broker in brokers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    published = [notification_id for broker in brokers for notification_id in broker.sent]
    assert len(published) == len(set(published)) == STAGED  # every row once, none twice
    assert sum(1 for broker in brokers if broker.sent) >= 2, "the sweeps did not run side by side"


def test_a_publish_that_fails_gives_its_rows_to_the_next_sweep(sessions: sessionmaker[Session]) -> None:
    class HalfBroker(ListEnqueuer):
        def enqueue_send(self, notification_ids: Iterable[int], *, queue: str = SEND_QUEUE) -> list[int]:
            ids = list(notification_ids)
            return super().enqueue_send(ids[: len(ids) // 2], queue=queue)  # the broker went away halfway

    half = HalfBroker()
    assert sweep(sessions=sessions, enqueuer=half, stale_after_s=300) == BATCH // 2  # stops at the failure
    rest = ListEnqueuer()
    assert sweep(sessions=sessions, enqueuer=rest, stale_after_s=300) == STAGED - BATCH // 2  # no stale wait
    assert sorted(half.sent + rest.sent) == sorted(set(half.sent + rest.sent))
