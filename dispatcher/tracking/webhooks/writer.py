"""Group commit: one blocking writer at a time, fed with everything that arrived meanwhile.

Each ``await writer.submit(item)`` returns that item's own result once the batch holding it
has been written, or raises the batch's exception. Items submitted while a batch is being
written (in Starlette's threadpool, off the event loop) form the next batch, up to
``max_batch`` items. An item alone is written at once: batching adds no waiting, it only
shares one transaction (and one broker pipeline) among requests that are already waiting.

Single event loop only (all state is touched from the loop thread, never from the writer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class GroupWriter(Generic[ItemT, ResultT]):
    def __init__(self, write: Callable[[Sequence[ItemT]], Sequence[ResultT]], *, max_batch: int = 128) -> None:
        self._write = write
        self._max_batch = max_batch
        self._pending: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._drainer: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Items submitted and not yet taken into a batch."""
        return len(self._pending)

    async def submit(self, item: ItemT) -> ResultT:
        future: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                try:
                    results = await run_in_threadpool(self._write, [item for item, _ in batch])
                except Exception as error:
                    for _, future in batch:
                        if not future.done():  # a client that hung up cancelled its future
                            future.set_exception(error)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._drainer = None
