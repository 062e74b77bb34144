"""tests/support/ports.py tells its own server's port from another's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.support.ports import listens
from tests.support.sandbox_process import free_port


def test_a_process_listening_on_the_port_is_seen_and_another_process_is_not() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert listens(os.getpid(), port)
        assert not listens(os.getpid(), free_port())
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not listens(other.pid, port)  # the port answers, but not from this process
        finally:
            other.kill()
            other.wait()


def test_a_process_that_is_gone_listens_nowhere() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not listens(gone.pid, free_port())
