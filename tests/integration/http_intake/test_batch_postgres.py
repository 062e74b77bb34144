"""Two hosts hand the same batch over at the same moment, on PostgreSQL: each event is stored once
and published once; every item of both answers is accepted or a duplicate, never lost."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from sqlalchemy import func, select

from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake.batch import ItemOutcome
from dispatcher.service import Dispatcher
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Notification, Payload
from tests.support.dispatcher_setup import example_settings, reminder

pytestmark = pytest.mark.integration


def test_twin_batches_store_and_publish_each_event_once(fresh_postgres_url: str, clean_environment: pytest.MonkeyPatch) -> None:
    upgrade_database(fresh_postgres_url)
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=fresh_postgres_url)
    twins = [Dispatcher(settings, enqueuer=ListEnqueuer()) for _ in range(2)]
    items = [reminder(f"twin-{n}", identifier=f"twin-patient-{n}", phone=f"+1555036{n:04d}") for n in range(300)]
    answers: list[list[ItemOutcome]] = [[], []]
    start = threading.Barrier(2)

    def hand_over(which: int) -> None:
        start.wait()
        answers[which] = [item.outcome for item in twins[which].notify_many(items)]

    threads = [threading.Thread(target=hand_over, args=(which,)) for which in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    for answer in answers:
        assert len(answer) == 300 and set(answer) <= {ItemOutcome.ACCEPTED, ItemOutcome.DUPLICATE}, Counter(answer)
    assert sum(answer.count(ItemOutcome.ACCEPTED) for answer in answers) == 300  # each event accepted by one twin
    with twins[0].sessions() as session:
        assert session.scalar(select(func.count()).select_from(Notification)) == 300
        assert session.scalar(select(func.count()).select_from(Payload)) == 300
    published = [nid for twin in twins for nid in twin.enqueuer.sent]  # type: ignore[attr-defined]
    assert sorted(published) == sorted(set(published)) and len(published) == 300
