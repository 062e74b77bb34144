"""Counters behind ``GET /_sandbox/stats``: calls per operationId, faults injected, webhook deliveries.

Plain counters, bumped synchronously on the event loop (see state.py for why that is safe).
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class Stats:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.faults: dict[str, Counter[str]] = {}
        self.webhooks: Counter[str] = Counter()

    def count_call(self, operation_id: str) -> None:
        self.calls[operation_id] += 1

    def count_fault(self, operation_id: str, kind: str) -> None:
        self.faults.setdefault(operation_id, Counter())[kind] += 1

    def count_webhook(self, what: str, n: int = 1) -> None:
        self.webhooks[what] += n

    def reset(self) -> None:
        self.calls.clear()
        self.faults.clear()
        self.webhooks.clear()

    def snapshot(self) -> dict[str, Any]:
        return {
            "calls": dict(self.calls),
            "faults": {op: dict(kinds) for op, kinds in self.faults.items()},
            "webhooks": dict(self.webhooks),
        }
