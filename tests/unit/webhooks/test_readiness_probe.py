"""Readiness's store probe runs once at a time: probes that come while one runs wait for its
answer, so a store that hangs holds one thread of Starlette's pool, not one per probe."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from dispatcher.tracking.webhooks.receiver import SingleFlight


def _blocking_check() -> tuple[threading.Event, list[int], Callable[[], bool]]:
    """A check that answers True once released, and counts its runs."""
    release, runs = threading.Event(), []

    def check() -> bool:
        runs.append(1)
        release.wait(timeout=10)
        return True

    return release, runs, check


def test_probes_that_come_while_one_runs_share_its_answer() -> None:
    release, runs, check = _blocking_check()
    probe = SingleFlight(check)

    async def three_at_once() -> list[bool]:
        waiting = [asyncio.ensure_future(probe.within(10)) for _ in range(3)]
        await asyncio.sleep(0)  # all three are waiting on the one run
        release.set()
        return list(await asyncio.gather(*waiting))

    assert asyncio.run(three_at_once()) == [True, True, True]
    assert len(runs) == 1


def test_a_check_that_hangs_answers_not_ready_within_the_bound_and_starts_no_second_run() -> None:
    release, runs, hangs = _blocking_check()
    probe = SingleFlight(hangs)

    async def twice() -> tuple[bool, bool]:
        first = await probe.within(0.05)
        second = await probe.within(0.05)  # the first run still hangs: no new thread for this one
        return first, second

    try:
        assert asyncio.run(twice()) == (False, False)
        assert len(runs) == 1
    finally:
        release.set()
