"""Quiet hours at intake: a notification due outside its route's send window is stored scheduled
for the window's next opening, in the recipient's time zone, the route's, or the default."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import ConfigurationError, InvalidEvent
from dispatcher.intake import accept as intake
from dispatcher.intake.batch import accept_many
from dispatcher.intake.request import parse_request
from dispatcher.operations.cancel import reschedule
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings
from dispatcher.store.migrate import upgrade_database
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import example_settings, reminder

NIGHT = datetime(2026, 11, 26, 22, 30, tzinfo=UTC)  # 23:30 in Berlin, 17:30 in New York
DAYTIME = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


def settings_with_window(url: str, **route_changes: object) -> Settings:
    routes = tomllib.loads((REPO_ROOT / "config" / "dispatcher.example.toml").read_text())["routes"]
    routes["sms"] |= {"send_window": "08:00-20:00", **route_changes}
    return example_settings(api_url="http://127.0.0.1:9", database_url=url, routes=routes,
                            default_time_zone="Europe/Berlin")


@pytest.fixture()
def dispatcher(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Dispatcher:
    url = f"sqlite:///{tmp_path}/quiet.sqlite"
    upgrade_database(url)
    return Dispatcher(settings_with_window(url), enqueuer=ListEnqueuer())


def hand_over(dispatcher: Dispatcher, event_id: str, now: datetime, **contact: object) -> str:
    request = reminder(event_id, identifier=f"p-{event_id}", phone="+15550370001", route="sms")
    request["contact"] |= contact
    record = intake.accept(parse_request(request), sessions=dispatcher.sessions, settings=dispatcher.settings,
                           enqueuer=dispatcher.enqueuer, clock=lambda: now)
    return f"{record.state} {record.send_at.isoformat() if record.send_at else '-'}"


def test_a_notification_due_in_quiet_hours_waits_for_the_window(dispatcher: Dispatcher) -> None:
    assert hand_over(dispatcher, "in-the-day", DAYTIME) == "queued -"
    assert hand_over(dispatcher, "at-night", NIGHT) == "scheduled 2026-11-27T07:00:00+00:00"  # 08:00 in Berlin
    # the recipient's own zone wins over the default: 17:30 in New York is inside the window
    assert hand_over(dispatcher, "in-new-york", NIGHT, time_zone="America/New_York") == "queued -"
    enqueuer = dispatcher.enqueuer
    assert isinstance(enqueuer, ListEnqueuer) and len(enqueuer.sent) == 2  # the scheduled one waits for the sweep


def test_a_batch_item_waits_as_a_single_one_would(dispatcher: Dispatcher) -> None:
    request = reminder("batch-night", identifier="p-bn", phone="+15550370002", route="sms")
    [item] = accept_many([request], sessions=dispatcher.sessions, settings=dispatcher.settings,
                         enqueuer=dispatcher.enqueuer, clock=lambda: NIGHT)
    assert item.state == "scheduled"
    assert dispatcher.status("batch-night").send_at == datetime(2026, 11, 27, 7, 0, tzinfo=UTC)


def test_a_reschedule_into_quiet_hours_goes_at_the_next_opening(dispatcher: Dispatcher) -> None:
    hand_over(dispatcher, "moved", NIGHT)
    record = reschedule(dispatcher.sessions, dispatcher.settings, "moved", datetime(2026, 11, 28, 21, 0, tzinfo=UTC),
                        clock=lambda: NIGHT)
    assert record.send_at == datetime(2026, 11, 29, 7, 0, tzinfo=UTC)


def test_a_zone_or_window_that_is_not_one_is_named(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError) as bad_window:
        settings_with_window(f"sqlite:///{tmp_path}/x.sqlite", send_window="8-20")
    assert "send_window" in str(bad_window.value)
    with pytest.raises(ConfigurationError) as bad_zone:
        settings_with_window(f"sqlite:///{tmp_path}/x.sqlite", time_zone="Mars/Olympus")
    assert "time_zone" in str(bad_zone.value) and "Mars" not in str(bad_zone.value)
    request = reminder("bad-zone", identifier="p", phone="+15550370003", route="sms")
    request["contact"]["time_zone"] = "Nowhere/Town"
    with pytest.raises(InvalidEvent) as refused:
        parse_request(request)
    assert refused.value.field == "contact.time_zone" and "Nowhere" not in str(refused.value)


def test_the_example_in_the_docs_works_as_written(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    text = (REPO_ROOT / "docs" / "notifications.md").read_text()
    example = tomllib.loads(text.split("## Quiet hours")[1].split("```toml\n")[1].split("```")[0])
    routes = tomllib.loads((REPO_ROOT / "config" / "dispatcher.example.toml").read_text())["routes"]
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=f"sqlite:///{tmp_path}/doc.sqlite",
                                routes={**routes, **example["routes"]}, default_time_zone=example["default_time_zone"])
    sms = settings.routes["sms"]
    assert (sms.send_window, sms.time_zone, settings.default_time_zone) == ("08:00-20:00", "Europe/Berlin",
                                                                             "Europe/Berlin")
    upgrade_database(settings.database_url)
    dispatcher = Dispatcher(settings, enqueuer=ListEnqueuer())
    assert hand_over(dispatcher, "doc-night", NIGHT) == "scheduled 2026-11-27T07:00:00+00:00"  # 08:00 in Berlin
