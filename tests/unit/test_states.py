"""Delivery states only move forward; failed ends an attempt; a failure after delivery is ignored."""

from __future__ import annotations

import pytest

from dispatcher.lifecycle.states import AttemptState as S
from dispatcher.lifecycle.states import advance, attempt_state_from_status


@pytest.mark.parametrize(
    ("current", "reported", "expected"),
    [
        (S.ACCEPTED, S.SENT, S.SENT),
        (S.SENT, S.DELIVERED, S.DELIVERED),
        (S.DELIVERED, S.READ, S.READ),
        (S.SENT, S.READ, S.READ),  # delivered may never be reported
        (S.DELIVERED, S.SENT, S.DELIVERED),  # out of order: never back
        (S.READ, S.DELIVERED, S.READ),
        (S.SENT, S.FAILED, S.FAILED),
        (S.ACCEPTED, S.FAILED, S.FAILED),
        (S.FAILED, S.READ, S.FAILED),  # failed ends the attempt
        (S.DELIVERED, S.FAILED, S.DELIVERED),  # contradicts what the channel said
        (S.READ, S.FAILED, S.READ),
        (S.SENT, S.SENT, S.SENT),
    ],
)
def test_advance(current: S, reported: S, expected: S) -> None:
    assert advance(current, reported) is expected


@pytest.mark.parametrize(
    ("status", "state"),
    [(None, S.ACCEPTED), ("sent", S.SENT), ("delivered", S.DELIVERED), ("read", S.READ), ("failed", S.FAILED),
     ("queued", S.ACCEPTED), ("bogus", S.ACCEPTED)],
)
def test_status_mapping(status: str | None, state: S) -> None:
    assert attempt_state_from_status(status) is state
