"""Kombu's filesystem transport, with a message file that is whole before any worker can see it.

Kombu's own ``_put`` creates the message file under its final name and writes it afterwards, and
its ``_get`` takes no lock: a worker polling the folder can take the file in between, read nothing
and die on the empty JSON (CI met it in the demo). Its ``_get`` also moves the file to the system's
temporary folder, which on another file system is a copy and a delete, so two workers can both take
one message. Here a message is written under a name no queue reads and renamed into place, and a
worker takes one by renaming it into a folder beside the queue: both are renames within one file
system, which are atomic, so a message is seen whole or not at all, and taken by one worker only.
An exchange's table of queues is replaced by a rename too (``_queue_bind``).

A URL ``filesystem://FOLDER`` selects this transport through Celery's ``broker_transport``
(:func:`dispatcher.queues.apply_broker_settings`); the URL users write does not change.
"""

from __future__ import annotations

import os
import uuid
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

TAKEN_FOLDER = "taken"  # beside the messages: where a worker renames the message it takes
WRITING_PREFIX = ".writing-"  # not "<time>_<id>.<queue>.msg", so no worker takes it half-written


class Channel(filesystem.Channel):
    # kombu's two base classes name the second parameter differently; it is passed by position
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        folder = self.data_folder_out
        # Kombu's name: the time orders messages in a queue, the queue name ends it. Zero-padded,
        # so that names sort as the times do (kombu's own do not when the milliseconds gain a digit).
        final = os.path.join(folder, f"{int(round(monotonic() * 1000)):015d}_{uuid.uuid4()}.{queue}.msg")
        writing = os.path.join(folder, f"{WRITING_PREFIX}{uuid.uuid4()}")
        try:
            with open(writing, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))  # type: ignore[no-untyped-call]
            os.replace(writing, final)
        except OSError as error:
            raise ChannelError(f"cannot add a message to the queue {queue!r}") from error

    def _queue_bind(self, exchange: Any, routing_key: Any, pattern: Any, queue: Any) -> None:
        """Kombu's creates the exchange's table file, then locks and writes it: a process that
        binds in between reads it empty and dies on the empty JSON (several workers starting at
        once; CI met it). Here binders take turns on a lock file of their own, and the table is
        replaced by a rename: whoever reads it (kombu's ``get_table``) sees it whole."""
        table = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        self.control_folder.mkdir(exist_ok=True)
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            with open(f"{table}.lock", "a+b") as turn:
                filesystem.lock(turn, filesystem.LOCK_EX)  # type: ignore[no-untyped-call]
                try:
                    queues = self.get_table(exchange)  # type: ignore[no-untyped-call]
                    if entry not in queues:
                        writing = self.control_folder / f"{WRITING_PREFIX}{uuid.uuid4()}"
                        writing.write_bytes(str_to_bytes(dumps([entry, *queues])))  # type: ignore[no-untyped-call]
                        os.replace(writing, table)
                finally:
                    filesystem.unlock(turn)  # type: ignore[no-untyped-call]
        except OSError as error:
            raise ChannelError(f"cannot bind the queue {queue!r}") from error

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        wanted = f"{queue}.msg"
        taken_folder = os.path.join(self.data_folder_in, TAKEN_FOLDER)
        os.makedirs(taken_folder, exist_ok=True)
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            taken = os.path.join(taken_folder, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except FileNotFoundError:  # another worker took it first
                continue
            try:
                with open(taken, "rb") as file:
                    payload = file.read()
                os.remove(taken)
            except OSError as error:
                raise ChannelError(f"cannot read a message of the queue {queue!r}") from error
            return loads(bytes_to_str(payload))  # type: ignore[no-untyped-call]
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel
