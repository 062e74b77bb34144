"""What the benchmarks under scripts/bench/ share: a throw-away PostgreSQL database, a Redis
server of their own, the sandbox, real workers, request builders and the machine.

Everything runs on loopback: PostgreSQL at 127.0.0.1:5432 (trust auth; a fresh ``bench_<hex>``
database, dropped afterwards) and a redis-server of the benchmark's own on a free port (stopped
afterwards): no benchmark touches data it did not make. Every benchmark prints one JSON object
on stdout; ``scripts/bench/all`` collects them.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402

ADMIN_URL = os.environ.get("DISPATCHER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")

# The benchmarks measure the dispatcher, not its configured politeness: the example limits
# (2,400 API calls and 90 contact searches a minute for the whole account) would cap every run
# at 40 calls a second. The limiter still runs on every call.
UNCAPPED = {
    "DISPATCHER_API_REQUESTS_PER_MINUTE": "1000000",
    "DISPATCHER_CONTACT_SEARCHES_PER_MINUTE": "1000000",
}
# The sandbox runs its default profile, stock (no status in events, X-Chatwoot-* headers, webhooks
# never retried), with ONE departure, for the reason above: a stock workspace allows 100 contact
# searches a minute per account, which would cap every run that makes new contacts at 100 a
# minute. docs/benchmarks.md says so (scripts/bench/report.py writes it).
BENCH_SANDBOX = "[behaviour]\ncontact_search_per_minute = 0  # lifted: see scripts/bench/common.py\n"

# A phone prefix no sandbox recipient rule touches (+1555010 fails, +1555020 never confirms).
PHONE_PREFIX = "+1555033"


@contextlib.contextmanager
def temp_database() -> Iterator[str]:
    """A fresh PostgreSQL database ``bench_<hex>``, migrated by the caller, dropped afterwards."""
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        from dispatcher.store.db import _engines

        engine = _engines.pop(url, None)
        if engine is not None:
            engine.dispose()
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """The URL of a redis-server of this benchmark's own on a free loopback port, nothing on disk,
    stopped afterwards: the machine's Redis and its data are never touched."""
    import tempfile

    from tests.support.redis_server import PrivateRedis

    with tempfile.TemporaryDirectory(prefix="bench-redis-") as folder:
        server = PrivateRedis(Path(folder))
        server.start()
        try:
            yield server.url
        finally:
            server.stop()


RABBITMQ_URL = os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")


@contextlib.contextmanager
def private_broker(kind: str, redis_url: str) -> Iterator[str]:
    """The broker URL of a benchmark run: ``redis`` is ``redis_url`` itself (a server of the
    benchmark's own); ``rabbitmq`` is a virtual host of the benchmark's own on the RabbitMQ at
    ``BENCH_RABBITMQ_URL`` (made with rabbitmqctl, deleted afterwards with everything in it), so
    the machine's queues are never touched."""
    if kind == "redis":
        yield redis_url
        return
    if kind != "rabbitmq":
        raise SystemExit(f"--broker must be redis or rabbitmq, not {kind!r}")
    from urllib.parse import urlsplit

    vhost = f"bench-{uuid.uuid4().hex[:10]}"
    user = urlsplit(RABBITMQ_URL).username or "guest"

    def rabbitmqctl(*arguments: str) -> None:
        done = subprocess.run(["rabbitmqctl", "-q", *arguments], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise SystemExit(f"rabbitmqctl {arguments[0]} failed: {done.stderr.strip()[:200]}")

    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield f"{RABBITMQ_URL.rstrip('/')}/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


def add_broker_argument(parser: Any) -> None:
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis",
                        help="redis: a server of the benchmark's own; rabbitmq: a virtual host of its own on "
                             "BENCH_RABBITMQ_URL (default amqp://guest:guest@127.0.0.1:5672), deleted afterwards")


@contextlib.contextmanager
def worker_stack(broker: str) -> Iterator[tuple[dict[str, str], Path]]:
    """What a worker benchmark runs on, all of its own and all removed afterwards: a fresh
    PostgreSQL database, a Redis server (the no-op's counters, and the limiter the workers share,
    which a worker on an AMQP broker refuses to run without), the broker (``private_broker``), the
    sandbox and a scratch folder. Yields the workers' environment (also set on this process) and
    the folder."""
    import tempfile

    from tests.support.sandbox_process import running_sandbox
    from tests.support.worker_process import dispatcher_environment

    with temp_database() as database_url, private_redis() as redis_url, private_broker(broker, redis_url) as broker_url, \
            running_sandbox(BENCH_SANDBOX) as sandbox, tempfile.TemporaryDirectory() as workdir:
        env = dispatcher_environment(api_url=sandbox.base_url, database_url=database_url, broker_url=broker_url,
                                     DISPATCHER_REDIS_URL=redis_url)
        env["BENCH_COUNTER_URL"] = redis_url
        os.environ.update(env)
        yield env, Path(workdir)


def environment(*, api_url: str, database_url: str, broker_url: str, uncapped: bool = True, **overrides: str) -> dict[str, str]:
    """The DISPATCHER_* environment of every process in a benchmark (the tests' fast retries)."""
    from tests.support.worker_process import dispatcher_environment

    extra = dict(UNCAPPED) if uncapped else {}
    extra.update(overrides)
    return dispatcher_environment(api_url=api_url, database_url=database_url, broker_url=broker_url, **extra)


def deployed_environment(*, api_url: str, database_url: str, broker_url: str, **overrides: str) -> dict[str, str]:
    """The DISPATCHER_* environment of a run at the settings users deploy: the example
    configuration's values, without the tests' shortened timers (FAST_TIMERS: retries, timeouts,
    sweeps, stale rows) and without the benchmarks' lifted limits (UNCAPPED), as the chaos run."""
    from tests.support.worker_process import FAST_TIMERS, dispatcher_environment

    env = dispatcher_environment(api_url=api_url, database_url=database_url, broker_url=broker_url)
    for fast in FAST_TIMERS:
        env.pop(fast, None)
    env.update(overrides)
    return env


def settings_from(env: dict[str, str]) -> Any:
    """Settings for a process that hands notifications over: the same values the workers get."""
    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        from dispatcher.settings import load_settings

        return load_settings()
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def reminder(event_id: str, contact: int, *, prefix: str = "bench-patient", phone_prefix: str = PHONE_PREFIX) -> dict[str, Any]:
    """An appointment reminder on the ``reminders`` route (platform inbox, approved template).

    The content starts ``Reminder <event_id>:`` so the sandbox's messages can be counted per event.
    ``phone_prefix``: the sandbox's recipient rules go by it (the default is touched by none).
    """
    return {
        "event_id": event_id,
        "route": "reminders",
        "contact": {"identifier": f"{prefix}-{contact}", "phone_number": f"{phone_prefix}{contact:04d}", "name": "Bench Patient"},
        "content": f"Reminder {event_id}: your appointment is tomorrow at 09:00",
        "template": {"name": "appointment_reminder", "language": "en", "category": "UTILITY",
                     "params": {"1": "Bench Patient", "2": "tomorrow 09:00"}},
    }


def event_of(content: str | None) -> str | None:
    """The event ID in a message's content (``Reminder <event_id>: ...``), or None."""
    if not content or not content.startswith("Reminder "):
        return None
    head = content[len("Reminder "):].split(":", 1)
    return head[0] if len(head) == 2 else None


def wait_until(condition: Callable[[], bool], *, timeout_s: float, what: str, interval_s: float = 0.1) -> bool:
    """Poll until ``condition`` holds; False after ``timeout_s`` (every wait is bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    print(f"warning: timed out after {timeout_s:.0f} s waiting for {what}", file=sys.stderr)
    return False


def start_worker(env: dict[str, str], log: Path, *, concurrency: int = 2, app: str = "workers.app",
                 queues: str = "dispatcher.send", name: str = "bench") -> subprocess.Popen[bytes]:
    """One Celery worker (prefork), as scripts/bench/send_path.py starts it (``BENCH_WORKER_LOGLEVEL=INFO``
    logs every task, to count runs and retries)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", app, "worker", "--queues", queues, "--hostname", f"{name}@%h",
             "--concurrency", str(concurrency), "--loglevel", os.environ.get("BENCH_WORKER_LOGLEVEL", "WARNING"),
             "--without-gossip", "--without-mingle"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )


def measure_noop_rate(env: dict[str, str], log: Path, *, tasks: int, concurrency: int, queue: str) -> float:
    """The no-op baseline (scripts/bench/noop_app.py): ``tasks`` no-op tasks published on ``queue``
    while no worker runs, then one worker (the dispatcher's app and settings, ``concurrency``);
    tasks a second from the first one's start to the last one's end, read from the counters in
    ``BENCH_COUNTER_URL`` (a Redis of the benchmark's own)."""
    import redis
    from celery import Celery

    from dispatcher.queues import broker_transport, broker_transport_options

    counter = redis.Redis.from_url(env["BENCH_COUNTER_URL"])
    counter.delete("bench:noop:done", "bench:noop:first", "bench:noop:last")
    producer = Celery("bench", broker=env["DISPATCHER_BROKER_URL"], set_as_current=False)
    producer.conf.broker_transport = broker_transport(env["DISPATCHER_BROKER_URL"])
    producer.conf.broker_transport_options = broker_transport_options(env["DISPATCHER_BROKER_URL"])
    for number in range(tasks):
        producer.send_task("bench.noop", args=[number], queue=queue)
    worker = start_worker(env, log, concurrency=concurrency, app="scripts.bench.noop_app", queues=queue)
    try:
        if not wait_until(lambda: int(counter.get("bench:noop:done") or 0) >= tasks, timeout_s=600, what="the no-op tasks"):
            raise SystemExit("the no-op baseline did not finish")
        elapsed = float(counter.get("bench:noop:last")) - float(counter.get("bench:noop:first"))  # type: ignore[arg-type]
        return tasks / elapsed
    finally:
        stop(worker)


def start_beat(env: dict[str, str], log: Path, schedule: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.app", "beat", "--loglevel", "WARNING", "--schedule", str(schedule)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )


def stop(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM (a warm shutdown), then SIGKILL after 20 s; pool children are killed too."""
    if process is None or process.poll() is not None:
        return
    import psutil

    children: list[Any] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        children = psutil.Process(process.pid).children(recursive=True)
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def accepted_count(engine: sa.Engine, prefix: str) -> int:
    with engine.connect() as connection:
        return int(connection.execute(
            sa.text("SELECT count(*) FROM notifications WHERE message_id IS NOT NULL AND event_id LIKE :p"),
            {"p": f"{prefix}%"},
        ).scalar_one())


def settled_count(engine: sa.Engine, prefix: str) -> int:
    """Notifications with a message or a final failure (nothing more will happen to them)."""
    with engine.connect() as connection:
        return int(connection.execute(
            sa.text("SELECT count(*) FROM notifications WHERE (message_id IS NOT NULL OR state = 'failed')"
                    " AND event_id LIKE :p"),
            {"p": f"{prefix}%"},
        ).scalar_one())


def machine() -> dict[str, Any]:
    """CPU, cores, memory, OS, Python, PostgreSQL and Redis versions: the 'machine' line."""
    import psutil

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    postgres = redis_version = "unknown"
    with contextlib.suppress(Exception):
        engine = sa.create_engine(ADMIN_URL)
        with engine.connect() as connection:
            postgres = str(connection.execute(sa.text("SHOW server_version")).scalar_one())
        engine.dispose()
    with contextlib.suppress(Exception):
        answer = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout
        redis_version = answer.split("v=", 1)[1].split()[0]
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "postgresql": postgres,
        "redis": redis_version,
    }


class LimiterGrants:
    """The shared rate limiter's grants by bucket while a run lasts, read from the limiter's Redis
    (the run's own): for the status reads' share of the limiter, grants to ``reads`` / grants to
    ``account`` (every API call takes ``account``; tracking's status reads take ``reads`` too).

    A grant is one member, the same in each bucket it took, of the buckets' sorted sets, scored
    with its time and kept for the 60 s window (dispatcher/policy/ratelimit.py). A thread reads
    the members granted since the start every ``interval_s`` (well inside those 60 s) and once at
    the end, so no grant is missed and none is counted twice. Nothing is written to Redis."""

    def __init__(self, redis_url: str, *, interval_s: float = 5.0, key_prefix: str = "dispatcher:rl:*") -> None:
        import threading

        import redis

        self._client = redis.Redis.from_url(redis_url, socket_timeout=5)
        self._interval_s = interval_s
        self._match = key_prefix + "bucket:*"  # the workers' prefix is dispatcher:rl:<account>: (make_limiter)
        self._since_ms = 0
        self._granted: dict[str, dict[bytes, float]] = {}  # by bucket: member -> grant time, unix ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limiter-grants", daemon=True)

    def __enter__(self) -> LimiterGrants:
        self._since_ms = int(time.time() * 1000)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._collect()
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._collect()

    def _collect(self) -> None:
        for key in self._client.scan_iter(match=self._match):
            bucket = key.decode().split("bucket:", 1)[1]
            members = self._client.zrangebyscore(key, self._since_ms, "+inf", withscores=True)
            self._granted.setdefault(bucket, {}).update(members)

    def most_in_a_minute(self, bucket: str) -> int:
        """The most grants of ``bucket`` in any 60-second span of the run."""
        times = sorted(self._granted.get(bucket, {}).values())
        most, first = 0, 0
        for last, at in enumerate(times):
            while times[first] <= at - 60_000:
                first += 1
            most = max(most, last - first + 1)
        return most

    def summary(self) -> dict[str, Any]:
        """Grants by bucket, the reads' share of all grants (None when nothing was granted), and
        the most reads and the most grants in any 60 s."""
        counts = {bucket: len(members) for bucket, members in sorted(self._granted.items()) if members}
        total = counts.get("account", 0)
        return {"by_bucket": counts, "reads_share": round(counts.get("reads", 0) / total, 3) if total else None,
                "most_reads_in_a_minute": self.most_in_a_minute("reads"),
                "most_grants_in_a_minute": self.most_in_a_minute("account")}


def emit(result: dict[str, Any]) -> None:
    """Print the benchmark's result as JSON (the last stdout line block ``all`` reads)."""
    result.setdefault("finished_at", datetime.now(UTC).isoformat(timespec="seconds"))
    print(json.dumps(result, indent=2, default=str))


def percentile(values: list[float], share: float) -> float:
    """Linear-interpolated percentile (as PostgreSQL's percentile_cont), ``share`` in 0..1."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = share * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cpu_seconds(worker_pids: list[int] = ()) -> dict[str, float]:  # type: ignore[assignment]
    """CPU seconds used so far, by component: the worker trees given, this process (intake or
    the in-process loop), PostgreSQL, the sandbox, Redis, and the whole machine (``machine``:
    busy time of every core, so ``machine`` minus the rest is what other processes used)."""
    import psutil

    totals = {"workers": 0.0, "this_process": 0.0, "postgresql": 0.0, "sandbox": 0.0, "redis": 0.0}
    for pid in worker_pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            tree = psutil.Process(pid)
            for process in [tree, *tree.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    times = process.cpu_times()
                    totals["workers"] += times.user + times.system
    me = psutil.Process().cpu_times()
    totals["this_process"] = me.user + me.system
    for process in psutil.process_iter(["name", "cmdline", "cpu_times"]):
        name = process.info["name"] or ""
        command = " ".join(process.info["cmdline"] or [])
        times = process.info["cpu_times"]
        if times is None:
            continue
        used = times.user + times.system
        if name.startswith("postgres"):
            totals["postgresql"] += used
        elif "-m sandbox" in command:
            totals["sandbox"] += used
        elif name.startswith("redis-server"):
            totals["redis"] += used
    system = psutil.cpu_times()
    extras = sum(getattr(system, name, 0.0) for name in ("nice", "irq", "softirq"))
    totals["machine"] = system.user + system.system + extras
    return totals


def cpu_ms_per_item(before: dict[str, float], after: dict[str, float], items: int) -> dict[str, float]:
    """Milliseconds of CPU per item by component, and ``other`` (the machine's rest: other users)."""
    used = {name: (after[name] - before.get(name, 0.0)) * 1000 / max(items, 1) for name in after}
    used["other"] = used.pop("machine") - sum(used.values())
    return {name: round(value, 2) for name, value in used.items()}
