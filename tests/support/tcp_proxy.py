"""A TCP proxy on loopback whose link can be cut: a database outage without stopping the database.

``cut()`` closes every open connection and refuses new ones (the client sees its connection reset,
then "connection refused"-like failures); ``freeze()`` keeps every connection open but passes no
byte either way (a database that hangs: only timeouts end a wait); ``restore()`` lets connections
through again. ``round_trips`` counts the client's turns to speak, over every connection: a run of
bytes from a client after its server spoke (or first) is one round trip, however many packets. The
database behind it stays up and is shared, so only the processes that connect through the proxy
live through the outage.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from tests.support.sandbox_process import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, answer_delay_s: float = 0.0) -> None:
        """``answer_delay_s``: each run of the server's bytes is held this long, so every round trip
        costs that much more (a database on another machine, for a benchmark)."""
        self.target = (target_host, target_port)
        self.answer_delay_s = answer_delay_s
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._open = threading.Event()
        self._open.set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.round_trips = 0
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        self._open.clear()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def freeze(self) -> None:
        self._flowing.clear()

    def restore(self) -> None:
        self._flowing.set()
        self._open.set()

    def close(self) -> None:
        self._stopping.set()
        self._flowing.set()
        self.cut()
        self._listener.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            if not self._open.is_set():
                client.close()  # the link is down: the client's connect fails at once
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            last_speaker: list[str] = [""]  # this connection's, shared by its two pumps
            for source, sink, speaker in ((client, upstream, "client"), (upstream, client, "server")):
                threading.Thread(target=self._pump, args=(source, sink, speaker, last_speaker), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, speaker: str = "", last_speaker: list[str] | None = None) -> None:
        try:
            while chunk := source.recv(65536):
                while not self._flowing.wait(timeout=0.1):  # frozen: hold the bytes
                    if self._stopping.is_set() or not self._open.is_set():
                        return
                if last_speaker is not None:
                    with self._lock:
                        if speaker == "client" and last_speaker[0] != "client":
                            self.round_trips += 1
                        last_speaker[0] = speaker
                if speaker == "server" and self.answer_delay_s:
                    time.sleep(self.answer_delay_s)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):  # the other direction's pump ends too, and both are closed
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._sockets -= {source, sink}


@contextlib.contextmanager
def tcp_proxy(target_host: str, target_port: int, *, answer_delay_s: float = 0.0) -> Iterator[TcpProxy]:
    proxy = TcpProxy(target_host, target_port, answer_delay_s=answer_delay_s)
    try:
        yield proxy
    finally:
        proxy.close()
