"""Real Celery workers and beat as child processes, for integration tests.

Every process gets the same DISPATCHER_* environment (a fresh PostgreSQL database, a Redis
broker in a database number of its own, the sandbox's URL); their output goes to files that the
privacy tests scan afterwards.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import redis

from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "config" / "dispatcher.example.toml"


# Shortened timers for the integration tests: a kinder world than a deployment's. A run that must
# hold at the settings users deploy (the chaos run) removes them.
FAST_TIMERS = {
    "DISPATCHER_HTTP_CONNECT_TIMEOUT_S": "2",
    "DISPATCHER_HTTP_READ_TIMEOUT_S": "2",
    "DISPATCHER_HTTP_WRITE_TIMEOUT_S": "2",
    "DISPATCHER_HTTP_POOL_TIMEOUT_S": "1",
    "DISPATCHER_RETRY_BASE_S": "0.2",
    "DISPATCHER_RETRY_CAP_S": "1.5",
    "DISPATCHER_RETRY_MAX_TRIES": "30",
    "DISPATCHER_SWEEP_INTERVAL_S": "1",
    "DISPATCHER_STALE_AFTER_S": "6",
}


def dispatcher_environment(
    *, api_url: str, database_url: str, broker_url: str, **overrides: str
) -> dict[str, str]:
    """The environment of every dispatcher process in a test: fast retries and sweeps (FAST_TIMERS)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("DISPATCHER_") or key.startswith("DISPATCHER_TEST_")}
    env.update(
        {
            "DISPATCHER_CONFIG": str(EXAMPLE),
            "DISPATCHER_API_URL": api_url,
            "DISPATCHER_DATABASE_URL": database_url,
            "DISPATCHER_BROKER_URL": broker_url,
            **FAST_TIMERS,
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(overrides)
    return env


def fresh_broker_url(redis_url: str) -> str:
    """A Redis database number of its own for this test, emptied first."""
    database = random.randint(8, 15)
    url = f"{redis_url.rstrip('/')}/{database}"
    redis.Redis.from_url(url).flushdb()
    return url


@dataclass
class ProcessGroup:
    """Child processes started with one environment; their logs live in ``log_dir``."""

    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _counter: int = 0
    _worker_options: dict[str, tuple[int, str]] = field(default_factory=dict)
    restarts: int = 0
    closed: bool = False  # set by stop_all: a supervisor thread still running then starts nothing more

    def ensure_running(self) -> None:
        """Act as a supervisor (systemd, a container's restart policy): start again any worker
        that exited, for example because it was killed while it was still starting."""
        for name, (concurrency, queues) in list(self._worker_options.items()):
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                self.processes.pop(name, None)
                self.start_worker(name, concurrency=concurrency, queues=queues)
                self.restarts += 1

    def retire(self, name: str) -> None:
        """Stop supervising a worker: ``ensure_running`` will not start it again (a machine lost
        for good). It is not stopped here."""
        self._worker_options.pop(name, None)

    def supervised(self) -> dict[str, int]:
        """The workers ``ensure_running`` keeps running, with their pool sizes."""
        return {name: concurrency for name, (concurrency, _) in self._worker_options.items()}

    def start(self, name: str, arguments: list[str]) -> subprocess.Popen[bytes]:
        if self.closed:
            raise RuntimeError(f"the process group is stopped: {name} is not started again")
        self._counter += 1
        log_path = self.log_dir / f"{name}-{self._counter}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, *arguments], cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.processes[name] = process
        return process

    def start_worker(
        self, name: str, *, concurrency: int = 2, queues: str = "dispatcher.send,dispatcher.maintenance"
    ) -> subprocess.Popen[bytes]:
        self._worker_options[name] = (concurrency, queues)
        return self.start(
            name,
            ["-m", "celery", "-A", "workers.app", "worker", "--queues", queues,
             "--concurrency", str(concurrency), "--hostname", f"{name}@%h", "--loglevel", "INFO",
             "--without-gossip", "--without-mingle"],
        )

    def start_beat(self) -> subprocess.Popen[bytes]:
        return self.start(
            "beat",
            ["-m", "celery", "-A", "workers.app", "beat", "--loglevel", "INFO",
             "--schedule", str(self.log_dir / "beat-schedule")],
        )

    def pool_children(self, name: str) -> list[psutil.Process]:
        process = self.processes.get(name)
        if process is None or process.poll() is not None:
            return []
        with contextlib.suppress(psutil.NoSuchProcess):
            return psutil.Process(process.pid).children(recursive=True)
        return []

    def stop(self, name: str, *, kill: bool = False) -> None:
        process = self.processes.pop(name, None)
        if process is None:
            return
        family: list[psutil.Process] = []
        with contextlib.suppress(psutil.NoSuchProcess):
            family = psutil.Process(process.pid).children(recursive=True)
        if kill:
            process.kill()
        else:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        for child in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()

    def stop_all(self) -> None:
        self.closed = True
        for name in list(self.processes):
            self.stop(name)

    def logs(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in sorted(self.log_dir.glob("*.log")))


@contextlib.contextmanager
def process_group(env: dict[str, str], log_dir: Path) -> Iterator[ProcessGroup]:
    group = ProcessGroup(env=env, log_dir=log_dir)
    try:
        yield group
    finally:
        group.stop_all()


def wait_until(condition: Callable[[], bool], *, timeout_s: float, interval_s: float = 0.25, what: str = "condition") -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout_s`` (never sleeps blindly long)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
