"""The receiver's listener: connections accepted from it have Nagle's algorithm off (TCP_NODELAY),
in one process and with ``--workers N`` alike (uvicorn's own listener for several workers leaves
it on: every keep-alive request after the first then waits ~40 ms for a delayed ACK)."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvicorn

from dispatcher.operations.cli.serving import TcpListenerConfig, tcp_listener


def _nodelay_of_accepted(listener: socket.socket) -> int:
    """TCP_NODELAY on the server's side of a connection asyncio accepted from ``listener``."""

    async def run() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listener)
        async with server:
            host, port = listener.getsockname()[:2]
            _, writer = await asyncio.open_connection(host, port)
            try:
                return await asyncio.wait_for(seen, timeout=10)
            finally:
                writer.close()

    return asyncio.run(run())


def test_connections_accepted_from_our_listener_have_nagle_off() -> None:
    listener = tcp_listener("127.0.0.1", 0)
    listener.listen()
    assert listener.proto == socket.IPPROTO_TCP
    assert _nodelay_of_accepted(listener) == 1


def test_uvicorn_s_own_listener_for_several_workers_leaves_nagle_on_which_is_why_ours_exists() -> None:
    # if this fails, uvicorn has fixed its listener (issue 3149) and serving.py may go
    listener = uvicorn.Config("x:y", host="127.0.0.1", port=0, workers=2).bind_socket()
    listener.listen()
    try:
        assert _nodelay_of_accepted(listener) == 0
    finally:
        listener.close()


def test_the_receiver_s_configuration_binds_our_listener_for_one_process_and_for_several() -> None:
    for workers in (1, 2):
        listener = TcpListenerConfig("x:y", host="127.0.0.1", port=0, workers=workers).bind_socket()
        try:
            assert (listener.proto, listener.get_inheritable()) == (socket.IPPROTO_TCP, True)
        finally:
            listener.close()


def test_an_address_in_use_is_an_os_error_the_command_reports_in_one_line() -> None:
    taken = tcp_listener("127.0.0.1", 0)
    taken.listen()
    try:
        with pytest.raises(OSError):
            tcp_listener("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
