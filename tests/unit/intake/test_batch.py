"""``notify_many``: a result per item, idempotent per item, one bad item refusing only itself,
and the store and the queue left exactly as the same items handed over one by one would leave them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import InvalidEvent
from dispatcher.intake.batch import MAX_BATCH, ItemOutcome
from dispatcher.service import Dispatcher
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Notification, Payload
from tests.support.dispatcher_setup import example_settings, reminder


@pytest.fixture()
def dispatcher(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Dispatcher:
    url = f"sqlite:///{tmp_path}/batch.sqlite"
    upgrade_database(url)
    return Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=url), enqueuer=ListEnqueuer())


def _request(number: int, **extra: object) -> dict[str, object]:
    return reminder(f"batch-{number}", identifier=f"batch-patient-{number}", phone=f"+1555033{number:04d}", **extra)


def _counts(dispatcher: Dispatcher) -> tuple[int, int]:
    with dispatcher.sessions() as session:
        return (int(session.scalar(select(func.count()).select_from(Notification)) or 0),
                int(session.scalar(select(func.count()).select_from(Payload)) or 0))


def test_a_batch_is_stored_and_queued_as_one_by_one_would_be(dispatcher: Dispatcher) -> None:
    later = (datetime.now(UTC) + timedelta(hours=3)).isoformat()
    items = [_request(n) for n in range(5)] + [_request(5, send_at=later)]
    results = dispatcher.notify_many(items)
    assert [(r.index, r.event_id, r.outcome, r.state) for r in results] == [
        (n, f"batch-{n}", ItemOutcome.ACCEPTED, "queued") for n in range(5)] + [(5, "batch-5", ItemOutcome.ACCEPTED, "scheduled")]
    assert _counts(dispatcher) == (6, 6)
    enqueuer = dispatcher.enqueuer
    assert isinstance(enqueuer, ListEnqueuer)
    queued = [dispatcher.status(f"batch-{n}") for n in range(5)]
    assert len(enqueuer.sent) == 5 and all(record.state == "queued" for record in queued)
    single = dispatcher.notify(_request(6))  # the single path's row, for comparison
    with dispatcher.sessions() as session:
        rows = {row.event_id: row for row in session.scalars(select(Notification))}
    for column in ("route", "fallback_route", "channel", "category", "current_attempt", "fingerprint"):
        assert getattr(rows["batch-0"], column) is not None or column == "fallback_route"
        if column != "fingerprint":
            assert getattr(rows["batch-0"], column) == getattr(rows[single.event_id], column), column
    assert rows["batch-0"].enqueued_at is not None and rows["batch-5"].enqueued_at is None


def test_each_item_is_decided_alone(dispatcher: Dispatcher) -> None:
    dispatcher.notify(_request(1))
    bad_phone = _request(2)
    bad_phone["contact"] = {"identifier": "x", "phone_number": "not a number", "name": "Ana"}
    items = [_request(0), _request(1), bad_phone, {**_request(1), "content": "Reminder batch-1: changed"},
             _request(0), {**_request(0), "content": "Reminder batch-0: other"}, "not an object", _request(3, route="nowhere")]
    results = dispatcher.notify_many(items)
    assert [(r.outcome, r.field) for r in results] == [
        (ItemOutcome.ACCEPTED, None),      # new
        (ItemOutcome.DUPLICATE, None),     # handed over before, the same request
        (ItemOutcome.REFUSED, "contact.phone_number"),
        (ItemOutcome.REFUSED, "event_id"),  # handed over before with another request
        (ItemOutcome.DUPLICATE, None),     # the same as an earlier item of this batch
        (ItemOutcome.REFUSED, "event_id"),  # an earlier item of this batch, another request
        (ItemOutcome.REFUSED, "body"),
        (ItemOutcome.REFUSED, "route"),
    ]
    assert results[1].state == "queued" and results[2].event_id == "batch-2"
    assert "not a number" not in repr(results)  # a refusal names the field, never the value
    assert _counts(dispatcher) == (2, 2)


def test_a_batch_handed_over_again_stores_nothing_new(dispatcher: Dispatcher) -> None:
    items = [_request(n) for n in range(20)]
    first = dispatcher.notify_many(items)
    again = dispatcher.notify_many(items)
    assert {r.outcome for r in first} == {ItemOutcome.ACCEPTED}
    assert {r.outcome for r in again} == {ItemOutcome.DUPLICATE}
    assert _counts(dispatcher) == (20, 20)
    enqueuer = dispatcher.enqueuer
    assert isinstance(enqueuer, ListEnqueuer) and len(enqueuer.sent) == 20


def test_routes_decided_in_the_store_take_the_single_path(dispatcher: Dispatcher) -> None:
    capped = [{"event_id": f"portal-{n}", "route": "web_session", "consent_ref": f"c-{n}",
               "contact": {"identifier": f"w-{n}", "phone_number": f"+1555034{n:04d}"}, "content": f"Hello {n}"}
              for n in range(12)]
    limit = dispatcher.settings.routes["web_session"].max_per_minute
    assert limit is not None and limit < 12
    results = dispatcher.notify_many(capped)
    assert [r.outcome for r in results].count(ItemOutcome.ACCEPTED) == limit
    assert {(r.outcome, r.field) for r in results[limit:]} == {(ItemOutcome.REFUSED, "route")}


def test_a_batch_over_the_limit_is_refused_whole(dispatcher: Dispatcher) -> None:
    with pytest.raises(InvalidEvent, match=f"at most {MAX_BATCH}"):
        dispatcher.notify_many([_request(0)] * (MAX_BATCH + 1))
    assert _counts(dispatcher) == (0, 0)


def test_the_example_in_the_docs_works_as_written(tmp_path: Path, clean_environment: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import dispatcher.service as service
    from tests.conftest import REPO_ROOT

    clean_environment.setattr(service, "_default", None)
    clean_environment.setenv("DISPATCHER_CONFIG", str(REPO_ROOT / "config" / "dispatcher.example.toml"))
    clean_environment.setenv("DISPATCHER_DATABASE_URL", f"sqlite:///{tmp_path}/docs.sqlite")
    clean_environment.setenv("DISPATCHER_BROKER_URL", "memory://")
    clean_environment.chdir(REPO_ROOT)
    section = (REPO_ROOT / "docs" / "notifications.md").read_text().split("## Handing over many at once")[1]
    block = section.split("```python\n")[1].split("```")[0]
    for _ in range(2):
        exec(compile(block, "docs/notifications.md", "exec"), {})  # noqa: S102 - our own docs
    assert capsys.readouterr().out.splitlines() == ["0 appt-2026-0001 accepted queued", "0 appt-2026-0001 duplicate queued"]
