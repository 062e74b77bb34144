"""A Redis server of the tests' own: ``redis-server`` on a free loopback port, nothing on disk.

The suite never touches a Redis it did not start (the machine's server on 6379 may hold someone
else's data): it starts this one, or uses the URL it is given in ``DISPATCHER_TEST_REDIS_URL``.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.support.sandbox_process import free_port


class RedisServerMissing(RuntimeError):
    """``redis-server`` is not installed."""


class PrivateRedis:
    """``redis-server`` on a free loopback port, nothing on disk: a restart loses every key."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise RedisServerMissing("redis-server is not installed (apt-get install redis-server)")
        self.starts += 1
        log = (self.directory / f"redis-{self.starts}.log").open("wb")
        with log:
            self.process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--daemonize", "no", "--dir", str(self.directory)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}")
                with contextlib.suppress(redis.RedisError):
                    # its own answer, not another test's server that took the port meanwhile
                    # (ours then exits, "address in use", and the loop above says so)
                    if client.info("server").get("process_id") == self.process.pid:
                        return
                time.sleep(0.05)
            raise RuntimeError("redis-server did not answer within 10 s")
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL, as a crash: with no persistence every queued task and limiter key is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
