"""A RabbitMQ node of a test's own: the distribution's ``rabbitmq-server`` as a private node on
free loopback ports, its data, logs and Erlang cookie in a temporary folder, removed at the end.

For a run that restarts its broker for real: ``kill()`` is a crash (SIGKILL to the node's
processes, no clean shutdown) and ``start()`` brings the same node back on the same data, so
durable queues and persistent messages are still there and what was delivered but not
acknowledged is delivered again. The machine's RabbitMQ (``rabbit@localhost`` on 5672) is shared
by the whole suite and is never touched: every file the node reads or writes is one of ours, none
in /etc/rabbitmq or /var/lib/rabbitmq.

As root, the node and ``rabbitmqctl`` run as the ``rabbitmq`` user, in a folder that user owns
(as postgres_server.py runs PostgreSQL as ``postgres``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tests.support.sandbox_process import free_port

# The package's own scripts. /usr/sbin's wrappers would switch to the rabbitmq user with HOME reset
# to /var/lib/rabbitmq (the machine node's cookie) and send the server's output to the machine
# node's /var/log/rabbitmq/startup_log.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
AMQP_0_9_1_HEADER = b"AMQP\x00\x00\x09\x01"

# The node's process group is SIGKILLed when the pipe from the test process reaches its end: the
# test process stopped the node, or died without stopping it (a timeout's os._exit, a SIGKILL).
# The pipe comes in as standard input and moves to fd 3, which only this watcher keeps.
WATCH_THEN_RUN = """
exec 3<&0 </dev/null
(read line <&3; kill -KILL 0) &
exec "$@" 3<&-
"""


class RabbitMQMissing(RuntimeError):
    """``rabbitmq-server`` is not installed."""


def _script(name: str) -> str:
    path = RABBITMQ_BIN / name
    if not path.exists():
        raise RabbitMQMissing(f"{name} is not installed (apt-get install rabbitmq-server)")
    return str(path)


def _live_members(group: int) -> list[int]:
    """The processes of a process group that have not exited (zombies count as gone)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _parent, process_group = stat.rsplit(")", 1)[1].split()[:3]
        if int(process_group) == group and state != "Z":
            members.append(int(entry.name))
    return members


class PrivateRabbitMQ:
    """One RabbitMQ node, ``private-<random>@localhost``, AMQP on 127.0.0.1:``port``; ``url``
    logs in as guest (allowed from loopback) to the default vhost."""

    def __init__(self, log_dir: Path | None = None) -> None:
        _script("rabbitmq-server")  # missing: say so before making anything
        self.root = Path(tempfile.mkdtemp(prefix="private-rabbitmq-"))  # under /tmp: the rabbitmq user can reach it
        self.log_dir = log_dir if log_dir is not None else self.root / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / "rabbitmq-0.log"
        self.node_name = f"private-{secrets.token_hex(5)}@localhost"
        self.port = free_port()
        # Without it the distribution port is the AMQP port + 20000: past 65535 for a high free port.
        self.dist_port = free_port()
        while self.dist_port == self.port:
            self.dist_port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._watch_pipe: int | None = None  # our end of the pipe the node's watcher reads
        self._user = self._rabbitmq_user()
        self._write_files()

    @staticmethod
    def _rabbitmq_user() -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("rabbitmq")
        except KeyError:
            return None  # no package user: RabbitMQ runs as root too

    def _write_files(self) -> None:
        home = self.root / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"  # never logged: any process holding it may run code on the node
        cookie.write_text(secrets.token_hex(20))
        cookie.chmod(0o400)  # Erlang refuses a cookie others can read
        # Empty: instead of /etc/rabbitmq/rabbitmq-env.conf (which names the machine's node) and
        # /etc/rabbitmq/rabbitmq.conf (which puts a listener on 5672).
        (self.root / "rabbitmq-env.conf").write_text("")
        (self.root / "rabbitmq.conf").write_text("")
        (self.root / "enabled_plugins").write_text("[].\n")  # no management plugin: a faster start
        if self._user is not None:
            for path in (self.root, home, cookie, *self.root.glob("*.conf"), self.root / "enabled_plugins"):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _environment(self) -> dict[str, str]:
        """For the server and rabbitmqctl alike; nothing inherited, so no RABBITMQ_* or ERL_*
        variable of the caller's reaches them."""
        return {
            "PATH": os.environ.get("PATH", os.defpath),
            "LANG": "C.UTF-8",
            "HOME": str(self.root / "home"),  # the Erlang cookie, for the node and rabbitmqctl
            "RABBITMQ_NODENAME": self.node_name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.root / "advanced.config"),  # absent, and not /etc's
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),  # queues and messages: kept across kill() and start()
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            "RABBITMQ_LOGS": "-",  # to standard output, which is the log file of each start
            "RABBITMQ_PID_FILE": str(self.root / "node.pid"),
            # Erlang distribution (the node's and rabbitmqctl's) on loopback only.
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            # The machine's epmd (4369) is shared: it only maps node names to ports, ours is unique, and
            # a crashed node's name goes when its connection to epmd closes. A private one (ERL_EPMD_PORT)
            # would be a daemon outliving the node, to kill on its own. If none runs, the node starts
            # one, on loopback only.
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def _run_as(self) -> tuple[int | None, int | None, list[int] | None]:
        """Popen's user, group and extra_groups: the rabbitmq user with none of root's groups, or ourselves."""
        if self._user is None:
            return None, None, None
        return self._user.pw_uid, self._user.pw_gid, []

    def start(self) -> None:
        """Start (again) the same node, on the same ports and data; returns once it accepts AMQP
        connections, or raises with the end of its log."""
        if self._process is not None and self._process.poll() is None:
            raise RuntimeError(f"{self.node_name} is already running")
        self.starts += 1
        self.log_path = self.log_dir / f"rabbitmq-{self.starts}.log"
        user, group, extra_groups = self._run_as()
        watched, self._watch_pipe = os.pipe()
        try:
            with self.log_path.open("wb") as log:
                self._process = subprocess.Popen(
                    ["/bin/sh", "-c", WATCH_THEN_RUN, "sh", _script("rabbitmq-server")],
                    env=self._environment(), stdin=watched, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                    start_new_session=True,  # a process group of its own, for kill()
                    user=user, group=group, extra_groups=extra_groups,
                )
        except BaseException:
            self._close_watch_pipe()
            raise
        finally:
            os.close(watched)
        self._wait_until_accepting()

    def _wait_until_accepting(self) -> None:
        began = time.monotonic()
        while time.monotonic() - began < START_TIMEOUT_S:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"RabbitMQ node {self.node_name} exited with {self._process.returncode} "
                                   f"while starting; the end of {self.log_path}:\n{self.log_tail()}")
            if self._answers_amqp():
                # AMQP may answer before the node has finished booting (a restarted node's durable
                # queues listed empty once): wait for the boot's end too
                left = max(START_TIMEOUT_S - (time.monotonic() - began), 1.0)
                try:
                    if self.rabbitmqctl("await_startup", "--timeout", str(int(left)), timeout=left + 10).returncode == 0:
                        return
                except subprocess.SubprocessError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"RabbitMQ node {self.node_name} did not accept AMQP connections on 127.0.0.1:"
                           f"{self.port} within {START_TIMEOUT_S:.0f} s; the end of {self.log_path}:\n{self.log_tail()}")

    def _answers_amqp(self) -> bool:
        """The broker answers a protocol header with Connection.Start (a method frame: type 1)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as connection:
                connection.sendall(AMQP_0_9_1_HEADER)
                return connection.recv(1) == b"\x01"
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL to the node's whole process group at once, as in an out-of-memory kill: no clean
        shutdown. Returns when none of it is left, so start() finds the ports and the data free."""
        if self._process is None:
            return
        group = self._process.pid  # its id stays reserved while any member lives: no other group's
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        self._process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _live_members(group):
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ node {self.node_name}'s processes outlived SIGKILL for 10 s")
            time.sleep(0.02)
        self._process = None  # the group is gone: its id may be anyone's now
        self._close_watch_pipe()

    def stop(self) -> None:
        """A clean shutdown (SIGTERM: rabbitmq-server stops the node), SIGKILL past 30 s; then
        the temporary folder goes, data and all (logs too, unless they are in ``log_dir``)."""
        try:
            if self._process is not None and self._process.poll() is None:
                self._process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout=STOP_TIMEOUT_S)
            self.kill()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _close_watch_pipe(self) -> None:
        if self._watch_pipe is not None:
            os.close(self._watch_pipe)
            self._watch_pipe = None

    def rabbitmqctl(self, *arguments: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl -n <this node>``, with this node's cookie."""
        env = self._environment()
        # Its own distribution port, not one of the 35672-35682 every other rabbitmqctl shares.
        env["RABBITMQ_CTL_DIST_PORT_MIN"] = env["RABBITMQ_CTL_DIST_PORT_MAX"] = str(free_port())
        user, group, extra_groups = self._run_as()
        return subprocess.run(
            [_script("rabbitmqctl"), "-q", "-n", self.node_name, *arguments], env=env, cwd=self.root,
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
            user=user, group=group, extra_groups=extra_groups)

    def queued(self) -> dict[str, int]:
        """Ready messages per ``dispatcher.*`` queue and, under ``unacked``, the unacknowledged ones
        in all; ``{"unreadable (<error>)": 0}`` when rabbitmqctl fails (the node down, say)."""
        try:
            queues = self.queues()
        except (OSError, subprocess.SubprocessError) as error:
            return {f"unreadable ({type(error).__name__})": 0}
        return queued_of(queues)

    def queues(self) -> dict[str, tuple[int, int]]:
        """Each ``dispatcher.*`` queue's (ready, unacknowledged) messages, by one rabbitmqctl call;
        raises OSError or SubprocessError when it fails."""
        done = self.rabbitmqctl("list_queues", "--no-table-headers", "name", "messages_ready",
                                "messages_unacknowledged")
        done.check_returncode()
        found: dict[str, tuple[int, int]] = {}
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].startswith("dispatcher.") and parts[1].isdigit() and parts[2].isdigit():
                found[parts[0]] = (int(parts[1]), int(parts[2]))
        return found

    def log_tail(self, characters: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-characters:]
        except OSError:
            return ""


def queued_of(queues: dict[str, tuple[int, int]]) -> dict[str, int]:
    """:meth:`PrivateRabbitMQ.queued`'s figures from :meth:`PrivateRabbitMQ.queues`."""
    counts: Counter[str] = Counter()
    for name, (ready, unacked) in queues.items():
        counts[name] += ready
        counts["unacked"] += unacked
    return dict(counts)


@contextlib.contextmanager
def private_rabbitmq(log_dir: Path | None = None) -> Iterator[PrivateRabbitMQ]:
    """A fresh node, started; stopped and removed on exit. Its log of each start goes to
    ``log_dir/rabbitmq-<n>.log`` (kept), or into its temporary folder (removed)."""
    node = PrivateRabbitMQ(log_dir)
    try:
        node.start()
        yield node
    finally:
        node.stop()
