"""When an unconfirmed attempt is read back: soon, then backing off, never past the horizon."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.lifecycle.states import AttemptState
from dispatcher.policy.readback import ReadBackPlan, next_read_at

PLAN = ReadBackPlan(first_after_s=60, max_interval_s=300, horizon_s=3600)
ACCEPTED = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return ACCEPTED + timedelta(seconds=seconds)


@pytest.mark.parametrize(("now_s", "expected_s"), [
    (0, 60),          # just accepted: the first read after a minute
    (120, 180),       # young: a minute apart
    (800, 1000),      # a quarter of its age apart
    (2000, 2300),     # never more than five minutes apart
    (3500, 3600),     # the last read at the horizon
])
def test_reads_back_off_with_age_within_the_horizon(now_s: float, expected_s: float) -> None:
    assert next_read_at(state=AttemptState.SENT, accepted_at=ACCEPTED, now=at(now_s), plan=PLAN) == at(expected_s)


def test_a_delivered_attempt_is_followed_through_to_read() -> None:
    assert next_read_at(state=AttemptState.DELIVERED, accepted_at=ACCEPTED, now=at(30), plan=PLAN) == at(90)


@pytest.mark.parametrize("state", [AttemptState.READ, AttemptState.FAILED, AttemptState.QUEUED])
def test_settled_or_unsent_attempts_are_never_read(state: AttemptState) -> None:
    assert next_read_at(state=state, accepted_at=ACCEPTED, now=at(10), plan=PLAN) is None


def test_nothing_is_read_past_the_horizon() -> None:
    assert next_read_at(state=AttemptState.SENT, accepted_at=ACCEPTED, now=at(3600), plan=PLAN) is None


def test_an_outcome_happening_within_the_horizon_is_learned_within_the_longest_interval() -> None:
    # reads scheduled from acceptance on never leave a gap longer than max_interval_s
    now, reads = ACCEPTED, []
    while (following := next_read_at(state=AttemptState.SENT, accepted_at=ACCEPTED, now=now, plan=PLAN)) is not None:
        reads.append(following)
        now = following
    gaps = [(b - a).total_seconds() for a, b in zip([ACCEPTED, *reads], reads, strict=False)]
    assert max(gaps) <= PLAN.max_interval_s and reads[-1] == at(PLAN.horizon_s)
    assert len(reads) <= 20  # bounded cost: about twenty reads in the first hour
