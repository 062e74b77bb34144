"""A PgBouncer of a test's own in front of a PostgreSQL server: ``pool_mode = transaction`` on a
free loopback port, trust authentication, a small server pool, removed at the end.

The pool is smaller than the clients a test opens, so consecutive transactions of one client
connection do run on different server connections: what would break in transaction mode (a
prepared statement or a setting outliving its transaction) breaks here.

PgBouncer refuses to run as root; where the tests run as root it runs as the ``postgres`` user
(``runuser``), in a folder that user owns, like tests/support/postgres_server.py.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.support.ports import listens
from tests.support.sandbox_process import free_port

SERVER_POOL_SIZE = 4


def _binary() -> str:
    found = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)
    if found is None:
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer; scripts/test installs it)")
    return found


class PrivatePgBouncer:
    """PgBouncer on 127.0.0.1:<free port>, every database passed to the PostgreSQL server at
    ``backend_url``'s host and port. :meth:`url_for` gives a database's URL through it."""

    def __init__(self, backend_url: str, *, pool_size: int = SERVER_POOL_SIZE) -> None:
        backend = make_url(backend_url)
        self.backend_host, self.backend_port = backend.host or "127.0.0.1", backend.port or 5432
        self.user = backend.username or "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="private-pgbouncer-"))
        self.port = free_port()
        self.pool_size = pool_size
        self.log_path = self.root / "pgbouncer.log"
        self._as_postgres = os.geteuid() == 0
        self._process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        (self.root / "users.txt").write_text(f'"{self.user}" ""\n')
        (self.root / "pgbouncer.ini").write_text(self._config())
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, user.pw_uid, user.pw_gid)

    def _config(self) -> str:
        # No server_reset_query: in transaction mode PgBouncer runs none, and each transaction
        # leaves the server connection as it found it. ignore_startup_parameters stays empty, so a
        # client that sends `options` is refused, as by a default pgbouncer.ini.
        return (
            "[databases]\n"
            f"* = host={self.backend_host} port={self.backend_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {self.pool_size}\nmin_pool_size = 0\n"
            "max_client_conn = 500\nserver_lifetime = 3600\n"
            f"logfile = {self.log_path}\npidfile = {self.root / 'pgbouncer.pid'}\n"
            f"admin_users = {self.user}\n"
        )

    def url_for(self, database_url: str, *, pooled_setting: bool = True) -> str:
        """``database_url``'s database through this PgBouncer, with the ``database_pooler`` setting
        in the URL (as Storage puts it there) unless ``pooled_setting`` is False."""
        url = make_url(database_url).set(host="127.0.0.1", port=self.port)
        if pooled_setting:
            url = url.update_query_dict({"dispatcher_pooler": "transaction"})
        return url.render_as_string(hide_password=False)

    def start(self) -> None:
        """Start (again) on the same port; returns once it listens."""
        self.starts += 1
        command = [_binary(), str(self.root / "pgbouncer.ini")]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        # A session of its own: a kill reaches pgbouncer under runuser, and nothing of the tests'.
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, cwd=self.root, start_new_session=True)
        deadline = time.monotonic() + 30
        while not listens(self._process.pid, self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start: {self.log_text()[-1000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: every client connection is cut at once, as when the pooler's machine is lost."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM: PgBouncer's immediate shutdown."""
        try:
            self._signal(signal.SIGTERM)
        except subprocess.TimeoutExpired:
            self.kill()

    def _signal(self, number: int) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, number)
            self._process.wait(timeout=30)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def private_pgbouncer(backend_url: str, *, pool_size: int = SERVER_POOL_SIZE) -> Iterator[PrivatePgBouncer]:
    """A PgBouncer in transaction mode in front of ``backend_url``'s server, started; stopped and
    removed on exit."""
    bouncer = PrivatePgBouncer(backend_url, pool_size=pool_size)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.remove()
