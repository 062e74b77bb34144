"""Exponential backoff with "equal jitter": the one piece of retry arithmetic.

Why jitter at all: after an outage or a 429 many workers fail at the same moment; without
jitter they would all come back at the same moment too. Why *equal* jitter rather than "full"
jitter: half of the wait is fixed, so a retry never comes back almost at once, and half is
random, so the spread survives at the cap (a capped "exponential without jitter" turns every
worker into a metronome on the same beat).

Pure: the caller passes the random source, so tests seed it and workers use their own.
"""

from __future__ import annotations

import random

__all__ = ["backoff_s"]

# 2**62 times any sane base is far past any cap; clamping keeps float arithmetic finite.
_MAX_EXPONENT = 62


def backoff_s(attempt: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Seconds to wait before retry number ``attempt`` (0 for the first retry).

    The ceiling is ``min(cap_s, base_s * 2**attempt)``; the result lies in
    ``[ceiling / 2, ceiling]``: half fixed, half drawn from ``rng``. So ``0 < result <= cap_s``
    always, and results still differ between workers once the ceiling sits at the cap.

    Raises ValueError for a negative ``attempt``, a non-positive ``base_s`` or a ``cap_s``
    below ``base_s``: those are programming errors, not conditions to retry around.
    """
    if attempt < 0:
        raise ValueError("attempt must be >= 0")
    if not base_s > 0:
        raise ValueError("base_s must be > 0")
    if not cap_s >= base_s:
        raise ValueError("cap_s must be >= base_s")
    ceiling_s = min(cap_s, base_s * 2.0 ** min(attempt, _MAX_EXPONENT))
    half_s = ceiling_s / 2.0
    return min(ceiling_s, half_s + rng.uniform(0.0, half_s))
