"""Run an ASGI app with uvicorn, in one process or several, with Nagle's algorithm off.

uvicorn's listener for several worker processes is made with ``socket.socket(family)``: its
protocol is left at 0, the sockets it accepts inherit that, and asyncio turns ``TCP_NODELAY`` on
only for a socket whose protocol says TCP. So with ``--workers 2`` every request after the first
on a keep-alive connection waited for the peer's delayed acknowledgement, about 40 ms on Linux
(uvicorn issue 3149; measured here with ``scripts/bench/receiver.py --workers 2``: 727
deliveries a second to a bare endpoint, against 10,000 in one process). One process is not
affected: asyncio makes that listener itself. This module makes the listener as TCP for both.
"""

from __future__ import annotations

import socket

import uvicorn
from uvicorn.supervisors import Multiprocess


class TcpListenerConfig(uvicorn.Config):
    """uvicorn's configuration, with a listening socket that says it is TCP."""

    def bind_socket(self) -> socket.socket:
        if self.uds is not None or self.fd is not None:
            return super().bind_socket()
        sock = tcp_listener(self.host, self.port)
        sock.set_inheritable(True)  # handed to the worker processes
        return sock


def tcp_listener(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` whose accepted connections asyncio makes ``TCP_NODELAY``.
    Raises OSError when the address cannot be taken (in use, not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def serve(config: TcpListenerConfig) -> bool:
    """Run ``config``'s app as ``uvicorn.run`` would: one server, or a supervisor of
    ``config.workers`` processes sharing one listener. False when the one server did not start
    (its app failed to load); raises OSError when the address cannot be taken."""
    listener = config.bind_socket()
    if config.workers > 1:
        Multiprocess(config, sockets=[listener]).run()
        return True
    server = uvicorn.Server(config)
    server.run(sockets=[listener])
    return server.started
