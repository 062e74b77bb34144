"""When an attempt is read back: unconfirmed ones soon, then backing off, never past the horizon;
a delivered one only where a read can still come, once; settled ones never."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.lifecycle.states import AttemptState
from dispatcher.policy.channels import reports_read
from dispatcher.policy.readback import ReadBackPlan, next_read_at
from dispatcher.settings import ChannelKind

PLAN = ReadBackPlan(first_after_s=60, max_interval_s=300, horizon_s=3600)
ACCEPTED = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return ACCEPTED + timedelta(seconds=seconds)


def reads_in_an_hour(state: AttemptState, channel: ChannelKind, *, news_at_s: float) -> list[float]:
    """The read-backs an attempt gets when its last news (``state``) came at ``news_at_s`` and no
    read finds anything new: an injected clock walks the plan from read to read."""
    reads: list[float] = []
    following = next_read_at(state=state, reports_read=reports_read(channel.value), accepted_at=ACCEPTED,
                             now=at(news_at_s), plan=PLAN)
    while following is not None:
        reads.append((following - ACCEPTED).total_seconds())
        following = next_read_at(state=state, reports_read=reports_read(channel.value), accepted_at=ACCEPTED,
                                 now=following, plan=PLAN, after_read=True)
    return reads


@pytest.mark.parametrize(("now_s", "expected_s"), [
    (0, 60),          # just accepted: the first read after a minute
    (120, 180),       # young: a minute apart
    (800, 1000),      # a quarter of its age apart
    (2000, 2300),     # never more than five minutes apart
    (3500, 3600),     # the last read at the horizon
])
def test_unconfirmed_reads_back_off_with_age_within_the_horizon(now_s: float, expected_s: float) -> None:
    assert next_read_at(state=AttemptState.SENT, reports_read=True, accepted_at=ACCEPTED, now=at(now_s),
                        plan=PLAN) == at(expected_s)


@pytest.mark.parametrize("channel", [ChannelKind.SMS, ChannelKind.EMAIL, ChannelKind.WEB_SESSION])
def test_a_delivered_message_on_a_channel_without_read_is_never_read_back(channel: ChannelKind) -> None:
    assert reads_in_an_hour(AttemptState.DELIVERED, channel, news_at_s=1) == []


@pytest.mark.parametrize("channel", [ChannelKind.MESSAGING_PLATFORM, ChannelKind.OTHER])
def test_a_delivered_message_where_read_exists_is_read_back_once_for_a_lost_read_report(channel: ChannelKind) -> None:
    assert reads_in_an_hour(AttemptState.DELIVERED, channel, news_at_s=1) == [61]


@pytest.mark.parametrize("state", [AttemptState.READ, AttemptState.FAILED, AttemptState.QUEUED])
def test_settled_or_unsent_attempts_are_never_read(state: AttemptState) -> None:
    assert next_read_at(state=state, reports_read=True, accepted_at=ACCEPTED, now=at(10), plan=PLAN) is None


def test_nothing_is_read_past_the_horizon() -> None:
    for state in (AttemptState.SENT, AttemptState.DELIVERED):
        assert next_read_at(state=state, reports_read=True, accepted_at=ACCEPTED, now=at(3600), plan=PLAN) is None


def test_an_unconfirmed_outcome_within_the_horizon_is_learned_within_the_longest_interval() -> None:
    reads = reads_in_an_hour(AttemptState.SENT, ChannelKind.SMS, news_at_s=0)
    gaps = [b - a for a, b in zip([0.0, *reads], reads, strict=False)]
    assert max(gaps) <= PLAN.max_interval_s and reads[-1] == PLAN.horizon_s
    assert len(reads) == 20  # the budget docs/tracking.md states for a message never confirmed in its hour


def test_the_channel_registry_says_which_channels_report_read() -> None:
    assert {kind for kind in ChannelKind if reports_read(kind.value)} == {ChannelKind.MESSAGING_PLATFORM,
                                                                           ChannelKind.OTHER}
    assert reports_read("a channel this version does not know")  # a read-back too many, never a read missed
