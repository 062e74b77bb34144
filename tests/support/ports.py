"""Whose server answers on a port: the tests start servers on ports chosen free a moment before.

Another test's server may take such a port between the choice and the bind; the server started
then fails to bind and exits, but until it has exited, the other one's ``/healthz`` answers for it
(a sandbox did so once, and two tests shared one). A start waits for an answer from a port its own
process listens on.
"""

from __future__ import annotations

import subprocess

import psutil


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid``, or a process it started, listens on TCP ``port``."""
    try:
        root = psutil.Process(pid)
        for process in (root, *root.children(recursive=True)):
            for connection in process.net_connections(kind="tcp"):
                if connection.status == psutil.CONN_LISTEN and connection.laddr and connection.laddr.port == port:
                    return True
    except psutil.Error:
        return False
    return False


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s: a server of a test's own, stopped at its end."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
