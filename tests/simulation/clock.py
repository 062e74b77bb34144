"""Simulated time: every clock the real code reads answers from one number the scheduler moves.

Nothing sleeps. Timers, backoffs, leases and deadlines fire because the scheduler advances
``now`` to the next thing due. While a simulation runs, ``time.time``/``time.monotonic`` and every
``datetime.now`` of our modules answer from here; they are restored after.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, tzinfo

START = 1_800_000_000.0  # 2027-01-15: far from any real date, so a leaked real clock shows


class SimClock:
    def __init__(self, start: float = START) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def utc(self) -> datetime:
        return datetime.fromtimestamp(self.now, UTC)

    def advance_to(self, when: float) -> None:
        assert when >= self.now, "simulated time never runs backwards"
        self.now = when


_current: SimClock | None = None


class _SimDatetime(datetime):
    """``datetime`` whose ``now()`` is the simulation's (the real code's ``utcnow`` and column
    defaults call ``datetime.now(UTC)`` through their module's name ``datetime``)."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
        assert _current is not None
        moment = datetime.fromtimestamp(_current.now, UTC)
        return moment if tz is None or tz is UTC else moment.astimezone(tz)


_PATCHED_PREFIXES = ("dispatcher", "workers", "sandbox")


@contextmanager
def simulated_time(clock: SimClock) -> Iterator[None]:
    global _current
    saved_time, saved_monotonic = time.time, time.monotonic
    swapped: list[tuple[object, str, object]] = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(_PATCHED_PREFIXES):
            continue
        if getattr(module, "datetime", None) is datetime:
            swapped.append((module, "datetime", datetime))
            module.datetime = _SimDatetime
    _current = clock
    time.time = clock.time
    time.monotonic = clock.time
    try:
        yield
    finally:
        time.time, time.monotonic = saved_time, saved_monotonic
        for module, attribute, original in swapped:
            setattr(module, attribute, original)
        _current = None
