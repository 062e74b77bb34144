"""A PostgreSQL server of a test's own: ``initdb`` in a temporary folder, ``pg_ctl`` on a free
loopback port, trust authentication, removed at the end.

For a run that crashes its database (``pg_ctl stop -m immediate``: the server processes end at
once, as in an out-of-memory kill or a lost machine, and the next start replays the WAL): the
machine's PostgreSQL on 5432 is shared by the whole suite and must never be touched.

PostgreSQL refuses to run as root; on a machine where the tests run as root, every PostgreSQL
command runs as the ``postgres`` user (``runuser``), in a folder that user owns.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.sandbox_process import free_port

BIN_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/15/bin")


class PostgresServerMissing(RuntimeError):
    """``initdb`` / ``pg_ctl`` are not installed."""


def _binary(name: str) -> str:
    for directory in BIN_DIRS:
        candidate = Path(directory) / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise PostgresServerMissing(f"{name} is not installed (apt-get install postgresql)")
    return found


class PrivatePostgres:
    """One PostgreSQL cluster on 127.0.0.1:<free port>; ``url`` names its ``postgres`` database."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="private-pg-"))  # under /tmp: the postgres user can reach it
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.starts = 0

    def _run(self, *arguments: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        command = list(arguments)
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              cwd=self.root)

    def init(self) -> None:
        done = self._run(_binary("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                         "--no-sync", "-E", "UTF8", "--locale", "C.UTF-8")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip()[-500:]}")

    def start(self) -> None:
        """Start (again) on the same port; returns once it accepts connections."""
        self.starts += 1
        # Loopback only, its socket in its own folder. fsync and full-page writes off: a crash
        # here is the server's processes dying, not the machine's, so the page cache keeps every
        # write; the 2-core machine has better uses for its disk time. synchronous_commit stays
        # on: off, a commit answers before its WAL leaves shared memory, and an immediate stop
        # loses the last commits (a chaos run lost two handed-over notifications so).
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                   "-c fsync=off -c full_page_writes=off -c max_connections=300")
        done = self._run(_binary("pg_ctl"), "start", "-D", str(self.data), "-l", str(self.log_path), "-w",
                         "-t", "60", "-o", options, timeout=90)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {done.stderr.strip()[-500:]} {self.log_text()[-1000:]}")

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: every server process quits at once, without a checkpoint;
        the next start recovers from the WAL, as after a crash."""
        done = self._run(_binary("pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate", "-w", timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl stop -m immediate failed: {done.stderr.strip()[-500:]}")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(_binary("pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w", timeout=60)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def wait_until_answers(url: str, timeout_s: float = 30) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with engine.connect() as connection:
                    connection.execute(sa.text("SELECT 1"))
                return
            except sa.exc.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        engine.dispose()


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A fresh cluster, started; stopped and removed (data and logs) on exit."""
    server = PrivatePostgres()
    try:
        server.init()
        server.start()
        wait_until_answers(server.url)
        yield server
    finally:
        server.remove()
