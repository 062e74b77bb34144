"""The demo's child processes: started with one environment, logged to files, all stopped at the end."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


class Children:
    """Named child processes; ``stop_all`` ends every one of them, whatever happened."""

    def __init__(self, *, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *arguments: str) -> subprocess.Popen[bytes]:
        with (self.log_dir / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", *arguments], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,  # Ctrl-C reaches the demo, which stops them
            )
        self.processes[name] = process
        return process

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                log = (self.log_dir / f"{name}.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"the {name} process exited ({process.returncode}):\n{log}")

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes.values():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def children(env: dict[str, str], log_dir: Path) -> Iterator[Children]:
    group = Children(env=env, log_dir=log_dir)
    try:
        yield group
    finally:
        group.stop_all()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_for_http(url: str, group: Children, *, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group.check_alive()
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")
