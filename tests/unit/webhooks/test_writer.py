"""GroupWriter: one writer at a time, later arrivals share the next batch, errors reach every waiter."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from dispatcher.tracking.webhooks.writer import GroupWriter


def test_one_item_alone_is_written_at_once() -> None:
    batches: list[list[int]] = []

    def write(items: Sequence[int]) -> list[int]:
        batches.append(list(items))
        return [item * 10 for item in items]

    async def main() -> int:
        return await GroupWriter(write).submit(4)

    assert asyncio.run(main()) == 40
    assert batches == [[4]]


def test_items_arriving_during_a_write_form_the_next_batch() -> None:
    # given a writer whose first batch is held until five more items are waiting
    release = threading.Event()
    batches: list[list[int]] = []

    def write(items: Sequence[int]) -> list[str]:
        if not batches:
            assert release.wait(5)
        batches.append(list(items))
        return [f"r{item}" for item in items]

    async def main() -> list[str]:
        writer: GroupWriter[int, str] = GroupWriter(write, max_batch=3)
        first = asyncio.create_task(writer.submit(0))
        await asyncio.sleep(0.05)  # the first batch [0] is in the threadpool now
        others = [asyncio.create_task(writer.submit(n)) for n in range(1, 6)]
        await asyncio.sleep(0.05)
        release.set()
        return [await first] + [await task for task in others]

    # then each caller gets its own result, and batches respect max_batch
    assert asyncio.run(main()) == ["r0", "r1", "r2", "r3", "r4", "r5"]
    assert batches == [[0], [1, 2, 3], [4, 5]]


def test_a_failed_batch_raises_in_every_waiter_and_the_next_batch_still_runs() -> None:
    calls = 0

    def write(items: Sequence[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if 13 in items:
            raise RuntimeError("store down")
        return list(items)

    async def main() -> tuple[BaseException | int, int]:
        writer: GroupWriter[int, int] = GroupWriter(write)
        failed = await asyncio.gather(writer.submit(13), return_exceptions=True)
        return failed[0], await writer.submit(7)

    error, later = asyncio.run(main())
    assert isinstance(error, RuntimeError) and later == 7 and calls == 2


def test_a_cancelled_waiter_does_not_break_the_batch() -> None:
    started = threading.Event()
    release = threading.Event()

    def write(items: Sequence[int]) -> list[int]:
        started.set()
        assert release.wait(5)
        return list(items)

    async def main() -> int:
        writer: GroupWriter[int, int] = GroupWriter(write)
        gone = asyncio.create_task(writer.submit(1))
        await asyncio.sleep(0.01)
        stays = asyncio.create_task(writer.submit(2))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        gone.cancel()  # the client hung up; the delivery is still written
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await stays

    assert asyncio.run(main()) == 2
