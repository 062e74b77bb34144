"""backoff_s: capped exponential growth, with jitter that survives the cap."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.policy.backoff import backoff_s

bases = st.floats(min_value=0.001, max_value=60.0)
attempts = st.integers(min_value=0, max_value=10_000)


@given(attempt=attempts, base_s=bases, extra_s=st.floats(min_value=0.0, max_value=3600.0),
       seed=st.integers())
def test_delay_is_positive_and_never_above_the_cap(attempt: int, base_s: float, extra_s: float,
                                                   seed: int) -> None:
    # given any plan and any random source
    cap_s = base_s + extra_s
    # when a delay is drawn
    delay_s = backoff_s(attempt, base_s=base_s, cap_s=cap_s, rng=random.Random(seed))
    # then it lies in (0, cap], and in the upper half of the ceiling (equal jitter)
    ceiling_s = min(cap_s, base_s * 2.0 ** min(attempt, 62))
    assert 0 < delay_s <= cap_s
    assert ceiling_s / 2 <= delay_s <= ceiling_s


@given(attempt=st.integers(min_value=20, max_value=10_000), base_s=bases,
       cap_factor=st.floats(min_value=1.0, max_value=1000.0))
def test_jitter_is_kept_at_the_cap(attempt: int, base_s: float, cap_factor: float) -> None:
    # given an attempt far enough along that the ceiling is the cap (2**20 > 1000)
    cap_s = base_s * cap_factor
    # when twenty workers with different seeds draw a delay
    delays = {backoff_s(attempt, base_s=base_s, cap_s=cap_s, rng=random.Random(seed))
              for seed in range(20)}
    # then they do not all come back on the same beat
    assert len(delays) > 1
    assert max(delays) <= cap_s


def test_grows_exponentially_before_the_cap() -> None:
    # given a fixed base and a far cap
    rng = random.Random(7)
    # when the attempt number rises
    delays = [backoff_s(n, base_s=1.0, cap_s=10_000.0, rng=rng) for n in range(8)]
    # then each delay sits in [2**n / 2, 2**n]
    for n, delay_s in enumerate(delays):
        assert 2**n / 2 <= delay_s <= 2**n


def test_same_seed_gives_the_same_delay() -> None:
    # given two sources seeded alike; when drawing; then the function is pure in its inputs
    first = backoff_s(3, base_s=2.0, cap_s=30.0, rng=random.Random(42))
    second = backoff_s(3, base_s=2.0, cap_s=30.0, rng=random.Random(42))
    assert first == second


@pytest.mark.parametrize(("attempt", "base_s", "cap_s"),
                         [(-1, 1.0, 10.0), (0, 0.0, 10.0), (0, -1.0, 10.0), (0, 5.0, 1.0),
                          (0, float("nan"), 10.0)])
def test_refuses_nonsense_arguments(attempt: int, base_s: float, cap_s: float) -> None:
    # given a negative attempt, a non-positive base or a cap below the base
    # when / then: a ValueError, not a silent zero delay
    with pytest.raises(ValueError):
        backoff_s(attempt, base_s=base_s, cap_s=cap_s, rng=random.Random(0))
