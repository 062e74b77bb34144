"""Send windows: inside, before, after, wrapping midnight, across a clock change."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dispatcher.policy.quiet_hours import SendWindow, next_opening, zone

BERLIN = zone("Europe/Berlin")
DAY = SendWindow.parse("08:00-20:00")


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.mark.parametrize(("due", "expected"), [
    ("2026-11-26T10:00:00+01:00", "2026-11-26T10:00:00+01:00"),  # inside: as it is
    ("2026-11-26T08:00:00+01:00", "2026-11-26T08:00:00+01:00"),  # the opening itself is inside
    ("2026-11-26T20:00:00+01:00", "2026-11-27T08:00:00+01:00"),  # the closing is outside: next morning
    ("2026-11-26T06:30:00+01:00", "2026-11-26T08:00:00+01:00"),  # early: this morning
    ("2026-11-26T23:59:00+01:00", "2026-11-27T08:00:00+01:00"),
    ("2026-03-29T01:30:00+01:00", "2026-03-29T08:00:00+02:00"),  # the night clocks go forward
])
def test_a_due_time_outside_the_window_waits_for_its_next_opening(due: str, expected: str) -> None:
    assert next_opening(at(due), DAY, BERLIN) == at(expected)


def test_the_window_is_read_in_the_zone_given() -> None:
    due = at("2026-11-26T06:00:00+00:00")  # 07:00 in Berlin, 01:00 in New York
    assert next_opening(due, DAY, BERLIN) == at("2026-11-26T07:00:00+00:00")
    assert next_opening(due, DAY, zone("America/New_York")) == at("2026-11-26T13:00:00+00:00")
    assert next_opening(due, DAY, BERLIN).tzinfo == UTC


def test_a_window_may_wrap_midnight() -> None:
    night = SendWindow.parse("20:00-08:00")
    assert next_opening(at("2026-11-26T23:00:00+01:00"), night, BERLIN) == at("2026-11-26T23:00:00+01:00")
    assert next_opening(at("2026-11-26T07:59:00+01:00"), night, BERLIN) == at("2026-11-26T07:59:00+01:00")
    assert next_opening(at("2026-11-26T12:00:00+01:00"), night, BERLIN) == at("2026-11-26T20:00:00+01:00")


@pytest.mark.parametrize("text", ["8-20", "08:00-08:00", "24:00-08:00", "08:00 - 20:00", ""])
def test_a_window_that_is_not_one_is_refused_without_repeating_it(text: str) -> None:
    with pytest.raises(ValueError) as refused:
        SendWindow.parse(text)
    assert text not in str(refused.value) or not text


def test_an_unknown_zone_is_refused_without_repeating_it() -> None:
    with pytest.raises(ValueError, match="IANA") as refused:
        zone("Mars/Olympus_Mons")
    assert "Mars" not in str(refused.value)
