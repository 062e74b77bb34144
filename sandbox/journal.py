"""The sandbox's state on disk, so that a restart keeps what a real workspace would keep.

A real workspace does not forget its contacts, conversations, messages and webhooks when it
restarts; a dispatcher that stored their ids must find them again. The sandbox therefore keeps
one file of JSON lines, ``{"k": kind, "r": record}``, one line per change:

* at start the file is read and replayed (a later line for the same kind and id replaces an
  earlier one), then rewritten compactly (one line per record) through a temporary file and an
  atomic rename;
* while running, every change is appended and flushed to the operating system, so a killed
  sandbox loses nothing it had answered (no fsync: a power cut is not what this guards against);
* at a clean stop the file is compacted again.

Counters are not stored: they restart past the largest id of each kind, so ids are never reused.
A ``boot`` line counts starts; the store's random stream is seeded with it, so a restarted sandbox
invents new source_ids, secrets and delivery ids rather than repeating the first run's.

The file holds what a workspace holds (names, phone numbers, message content): it is created
with mode 0600 and locked, so two sandboxes cannot write one file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

KINDS = ("contact", "binding", "conversation", "message", "webhook", "window")


class StateFileError(Exception):
    """The state file cannot be used (unreadable, not ours, or held by another sandbox)."""


@dataclass
class Restored:
    """What the file held: records by kind and id (``window`` by "contact_id:inbox_id"), and starts."""

    records: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {kind: {} for kind in KINDS})
    boots: int = 0

    @property
    def empty(self) -> bool:
        return not any(self.records.values())


def record_key(kind: str, record: dict[str, Any]) -> str:
    if kind == "window":
        return f"{record['contact_id']}:{record['inbox_id']}"
    return str(record["id"])


class Journal:
    """Appends changes to the state file; ``Journal(None)`` keeps nothing (``--in-memory``)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._lock: IO[bytes] | None = None
        self.boots = 0

    # -- start ----------------------------------------------------------------------------------
    def open(self, *, fresh: bool) -> Restored:
        """Lock the file, read it (unless ``fresh``) and count this start. Raises StateFileError."""
        if self.path is None:
            return Restored()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.path.with_name(self.path.name + ".lock"), "wb")  # noqa: SIM115
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateFileError("the state file is in use by another sandbox") from None
        except OSError as exc:
            raise StateFileError(f"cannot open the state file ({exc.strerror})") from None
        restored = self._read() if self.path.exists() else Restored()
        self.boots = restored.boots
        if fresh:  # forget the records, but keep counting starts: ids never repeat an earlier run's
            return Restored(boots=restored.boots)
        return restored

    def _read(self) -> Restored:
        assert self.path is not None
        restored = Restored()
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise StateFileError(f"cannot read the state file ({type(exc).__name__})") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                kind, record = entry["k"], entry["r"]
                if kind == "boot":
                    restored.boots = max(restored.boots, int(record["n"]))
                    continue
                restored.records[kind][record_key(kind, record)] = record
            except (ValueError, KeyError, TypeError):
                if number == len(lines):
                    break  # the last line of a killed sandbox may be cut short: it was never answered
                raise StateFileError(f"the state file is not a sandbox state file (line {number})") from None
        return restored

    # -- running --------------------------------------------------------------------------------
    def rewrite(self, entries: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Replace the file by these records and one ``boot`` line, then keep appending to it."""
        if self.path is None:
            return
        if self._file is not None:
            self._file.close()
        temporary = self.path.with_name(self.path.name + ".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(_line("boot", {"n": self.boots}))
            for kind, record in entries:
                out.write(_line(kind, record))
        os.replace(temporary, self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def start_counted(self, entries: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Count this start (the next start sees one more) and compact what was restored."""
        self.boots += 1
        self.rewrite(entries)

    def write(self, kind: str, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(_line(kind, record))
            self._file.flush()

    def close(self, entries: Iterable[tuple[str, dict[str, Any]]] | None = None) -> None:
        """At a clean stop: compact (when ``entries`` are given) and release the file."""
        if self.path is None:
            return
        if entries is not None:
            self.rewrite(entries)
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def _line(kind: str, record: dict[str, Any]) -> str:
    return json.dumps({"k": kind, "r": record}, separators=(",", ":"), ensure_ascii=False) + "\n"
