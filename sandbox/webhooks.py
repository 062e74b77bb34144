"""Signed webhook deliveries, with the misbehaviour of a real network made configurable.

Signature (field notes): ``sha256=`` + lowercase hex HMAC-SHA256, key = the secret string's own bytes,
message = ``<unix seconds>.<exact raw body>``. The delivery id is kept across retries; timestamp and
signature are computed afresh for each attempt.

Deliveries never block an API answer: :meth:`WebhookDispatcher.publish` only schedules; worker tasks
on the same event loop do the HTTP. Every random choice (drop, duplicate, reorder) draws from the
store's seeded ``random.Random``, so a run with the same requests replays the same choices.

Safety: deliveries go only to hosts in ``webhooks.allowed_hosts`` (loopback by default). A webhook
whose URL names any other host is stored, as the real service would, but never called.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import random
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from sandbox.config import Webhooks
from sandbox.records import WebhookRec
from sandbox.stats import Stats


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` over ``<timestamp>.<body>`` with the secret's UTF-8 bytes as key."""
    digest = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


# What Rails' JSON encoder (ActiveSupport, escape_html_entities_in_json) writes as escapes. These
# characters occur only inside JSON strings, so replacing them in the text keeps the JSON equal.
_RAILS_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                                "\u2028": "\\u2028", "\u2029": "\\u2029"})


def encode_payload(payload: dict[str, Any], *, escape_html: bool) -> bytes:
    """Compact JSON, as the real service sends it; the signature covers exactly these bytes.

    ``escape_html`` (the stock profile): ``<``, ``>``, ``&`` (and U+2028/U+2029) as ``\\u003c``
    etc., non-ASCII raw UTF-8, as the stock server writes it. A receiver that parses and
    re-serialises the body before verifying therefore fails, as it would in the field.
    """
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    if escape_html:
        text = text.translate(_RAILS_ESCAPES)
    return text.encode("utf-8")


@dataclasses.dataclass
class Delivery:
    webhook_id: int
    url: str
    secret: str
    delivery_id: str
    event: str
    body: bytes
    retries_done: int = 0


class WebhookDispatcher:
    """Queue plus workers; see the module docstring for the guarantees."""

    def __init__(
        self,
        settings: Webhooks,
        *,
        escape_html: bool,
        rng: random.Random,
        stats: Stats,
        clock: Callable[[], float] = time.time,
    ):
        self.settings = settings
        self.escape_html = escape_html
        self.rng = rng
        self.stats = stats
        self.clock = clock
        self.generation = 0
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._held: Delivery | None = None
        self._held_handle: asyncio.TimerHandle | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self.settings.timeout_s, trust_env=False, follow_redirects=False)
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.concurrency)]

    async def stop(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    def reset(self, rng: random.Random) -> None:
        """Forget queued and scheduled deliveries (attempts in flight finish but are not retried)."""
        self.rng = rng
        self.generation += 1
        while not self._queue.empty():
            self._queue.get_nowait()
            self._queue.task_done()
        if self._held_handle is not None:
            self._held_handle.cancel()
        self._held, self._held_handle = None, None

    def pending(self) -> int:
        return self._queue.qsize() + (1 if self._held else 0)

    # -- scheduling (synchronous, called from request handlers and timers) -------------------
    def publish(self, hooks: list[WebhookRec], event: str, payload: dict[str, Any]) -> None:
        if not hooks:
            return
        body = encode_payload(payload, escape_html=self.escape_html)
        for hook in hooks:
            self.stats.count_webhook("events")
            delivery = Delivery(hook.id, hook.url, hook.secret, self._new_id(), event, body)
            if urlsplit(hook.url).hostname not in self.settings.allowed_hosts:
                self.stats.count_webhook("blocked_host")
                continue
            if self.rng.random() < self.settings.drop_share:
                self.stats.count_webhook("dropped")
                continue
            copies = [delivery]
            if self.rng.random() < self.settings.duplicate_share:
                self.stats.count_webhook("duplicated")
                copies.append(dataclasses.replace(delivery, delivery_id=self._new_id()))
            for copy in copies:
                self._after_delay(copy)

    def _new_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _after_delay(self, delivery: Delivery) -> None:
        if self.settings.delay_s > 0:
            asyncio.get_running_loop().call_later(self.settings.delay_s, self._enqueue, delivery, self.generation)
        else:
            self._enqueue(delivery, self.generation)

    def _enqueue(self, delivery: Delivery, generation: int) -> None:
        if generation != self.generation:
            return
        if self._held is None and self.rng.random() < self.settings.reorder_share:
            self.stats.count_webhook("reordered")
            self._held = delivery
            loop = asyncio.get_running_loop()
            self._held_handle = loop.call_later(self.settings.reorder_hold_s, self._release_held)
            return
        self._queue.put_nowait(delivery)
        self._release_held()

    def _release_held(self) -> None:
        if self._held is not None:
            self._queue.put_nowait(self._held)
        if self._held_handle is not None:
            self._held_handle.cancel()
        self._held, self._held_handle = None, None

    def _retry(self, delivery: Delivery, generation: int) -> None:
        if generation == self.generation:
            self._queue.put_nowait(delivery)

    # -- delivery (the only awaiting part) ----------------------------------------------------
    async def _work(self) -> None:
        while True:
            delivery = await self._queue.get()
            try:
                await self._attempt(delivery)
            except Exception:  # a worker must survive anything a receiver does
                self.stats.count_webhook("worker_errors")
            finally:
                self._queue.task_done()

    async def _attempt(self, delivery: Delivery) -> None:
        assert self._client is not None
        generation = self.generation
        prefix = self.settings.header_prefix
        timestamp = str(int(self.clock()))
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            f"X-{prefix}-Delivery": delivery.delivery_id,
            f"X-{prefix}-Timestamp": timestamp,
            f"X-{prefix}-Signature": sign(delivery.secret, timestamp, delivery.body),
        }
        self.stats.count_webhook("attempts")
        try:
            response = await self._client.post(delivery.url, content=delivery.body, headers=headers)
            ok = 200 <= response.status_code < 300
        except httpx.HTTPError:
            ok = False
        if ok:
            self.stats.count_webhook("delivered")
            return
        self.stats.count_webhook("failed_attempts")
        if delivery.retries_done >= self.settings.max_retries:
            self.stats.count_webhook("gave_up")
            return
        delivery.retries_done += 1
        self.stats.count_webhook("retries")
        asyncio.get_running_loop().call_later(self.settings.retry_delay_s, self._retry, delivery, generation)
