"""What the demo remembers between runs in its folder: how many runs, and its webhook.

A workspace shows a webhook's signing secret only when the webhook is made, and (a stock one)
refuses a second webhook for the same URL; so the demo keeps the receiver's port and the secret,
as an operator keeps a secret in a secret store. The file is written with mode 0600.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

FILE_NAME = "demo.json"


@dataclass
class DemoMemory:
    path: Path
    runs: int = 0
    receiver_port: int | None = None
    webhook_secret: str | None = None

    @classmethod
    def load(cls, workdir: Path) -> DemoMemory:
        path = workdir / FILE_NAME
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls(path)  # first run, or a file the demo cannot read: start counting afresh
        return cls(path, runs=int(saved.get("runs", 0)), receiver_port=saved.get("receiver_port"),
                   webhook_secret=saved.get("webhook_secret"))

    def save(self) -> None:
        values = asdict(self)
        values.pop("path")
        temporary = self.path.with_name(FILE_NAME + ".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            json.dump(values, out)
        os.replace(temporary, self.path)
