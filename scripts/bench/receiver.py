"""Verified webhook deliveries a second: the receiver against a bare Starlette endpoint.

Both servers run the same way, one after the other in the same run: one uvicorn process (``--workers N``:
N worker processes) (``--loop asyncio --http h11 --no-access-log --log-level warning``) on a free loopback port. The
bare app answers 200 to the POST and does nothing else. The receiver verifies the signature,
parses and summarises the JSON, inserts the delivery (SQLite file or a fresh PostgreSQL
database) and publishes the row ID to a real Redis broker with Celery's producer.

The load is the same bounded set of pre-signed requests (unique delivery IDs, a realistic
``message_updated`` body of about 1.3 KB), sent from ``--processes`` load processes with
``--connections`` keep-alive connections each, by a minimal asyncio HTTP/1.1 client (httpx tops
out near 480 requests a second on this machine and would measure itself). Afterwards the
script checks that every delivery became a row and a task in the broker list.

    .venv/bin/python scripts/bench/receiver.py --requests 10000 --store sqlite --store postgres

Prints JSON with both rates per store (medians over ``--rounds``) and the median of the per-round
ratios (target: at least 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import private_redis  # noqa: E402  (scripts/bench/common.py, beside this script)

ADMIN_URL = os.environ.get("DISPATCHER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
SECRET = "bench-secret-4e1f"
PATH = "/webhooks/messaging"
UVICORN = ["--loop", "asyncio", "--http", "h11", "--no-access-log", "--log-level", "warning"]
SERVE_WORKERS = """
import sys
from dispatcher.operations.cli.serving import TcpListenerConfig, serve
app, port, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
serve(TcpListenerConfig(app, factory=True, host="127.0.0.1", port=port, workers=workers, loop="asyncio",
                        http="h11", access_log=False, log_level="warning"))
"""


def bare_app() -> Any:
    """The baseline: the same path, answers 200 with a short JSON body, nothing else."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def endpoint(request: Any) -> Response:
        return Response(b'{"status":"accepted"}', media_type="application/json")

    async def healthz(request: Any) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(routes=[Route(PATH, endpoint, methods=["POST"]), Route("/healthz", healthz)])


def event_body(n: int) -> bytes:
    """A message_updated delivery in the sandbox's (field notes') shape."""
    phone = f"+1555{n % 10_000_000:07d}"
    payload = {
        "event": "message_updated", "id": 100_000 + n, "content": "Reminder: your appointment is on Friday at 10:00.",
        "content_type": "text", "content_attributes": {}, "additional_attributes": {}, "message_type": "outgoing",
        "private": False, "source_id": None, "status": "delivered", "created_at": "2026-05-28T20:26:40.000Z",
        "sender": {"id": 1, "name": "Sandbox Integration", "type": "user"},
        "inbox": {"id": 2, "name": "SMS"}, "account": {"id": 1, "name": "Demo Clinic"},
        "conversation": {
            "id": 1 + n % 500, "inbox_id": 2, "status": "open", "channel": "Channel::Sms", "can_reply": True,
            "contact_inbox": {"id": 5001 + n % 500, "contact_id": 1 + n % 500, "inbox_id": 2, "source_id": phone,
                              "created_at": "2026-05-28T20:20:00.000Z", "hmac_verified": False},
            "messages": [{"id": 100_000 + n, "content": "Reminder", "account_id": 1, "inbox_id": 2,
                          "conversation_id": 1 + n % 500, "message_type": 1, "created_at": 1780000000,
                          "private": False, "status": "delivered", "source_id": None, "content_type": "text",
                          "content_attributes": {}, "additional_attributes": {}}],
            "labels": [], "meta": {"sender": {"id": 1 + n % 500, "name": f"Patient {n}", "email": None,
                                              "phone_number": phone, "identifier": None, "type": "contact"},
                                   "assignee": None, "team": None, "hmac_verified": False},
            "custom_attributes": {}, "additional_attributes": {}, "unread_count": 0,
            "created_at": 1780000000, "timestamp": 1780000000, "last_activity_at": 1780000000,
        },
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def signed_requests(count: int, port: int) -> list[bytes]:
    timestamp = str(int(time.time())).encode()
    requests = []
    for n in range(count):
        body = event_body(n)
        signature = hmac.new(SECRET.encode(), timestamp + b"." + body, hashlib.sha256).hexdigest().encode()
        requests.append(
            b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1:" + str(port).encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\nX-Service-Delivery: " + uuid.uuid4().hex.encode() + b"\r\nX-Service-Timestamp: " + timestamp
            + b"\r\nX-Service-Signature: sha256=" + signature + b"\r\n\r\n" + body
        )
    return requests


# -- the load: a minimal keep-alive HTTP/1.1 client (as scripts/bench/sandbox.py) --------------

async def _connection(port: int, requests: list[bytes], counts: dict[str, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for request in requests:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            counts["ok" if head[9:12] == b"200" else "not_ok"] += 1
    finally:
        writer.close()


def _load_process(port: int, requests: list[bytes], connections: int, max_seconds: float, start_at: float,
                  out: Any) -> None:
    async def drive() -> dict[str, int]:
        counts = {"ok": 0, "not_ok": 0}
        jobs = [_connection(port, requests[i::connections], counts) for i in range(connections)]
        await asyncio.wait_for(asyncio.gather(*jobs), timeout=max_seconds)
        return counts

    time.sleep(max(0.0, start_at - time.time()))
    began = time.perf_counter()
    counts = asyncio.run(drive())
    out.put({**counts, "seconds": time.perf_counter() - began})


def drive_load(port: int, requests: list[bytes], *, processes: int, connections: int, max_seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 1.5
    procs = [ctx.Process(target=_load_process, args=(port, requests[i::processes], connections, max_seconds,
                                                      start_at, out)) for i in range(processes)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=max_seconds + 30) for _ in procs]
    for proc in procs:
        proc.join(timeout=10)
    ok, seconds = sum(r["ok"] for r in results), max(r["seconds"] for r in results)
    return {"ok": ok, "not_ok": sum(r["not_ok"] for r in results), "seconds": round(seconds, 3),
            "per_second": round(ok / seconds, 1)}


# -- servers and stores -----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(app: str, env: dict[str, str], log: Path, workers: int = 1) -> Iterator[int]:
    import httpx

    port = free_port()
    # Several workers: a parent process and ``workers`` children on one listener (each its own event
    # loop, pool and broker connection), as `dispatcher receiver --workers N` runs them, through
    # its listener (dispatcher/operations/cli/serving.py: uvicorn's own leaves Nagle's algorithm on).
    command = [sys.executable, "-m", "uvicorn", "--factory", app, "--host", "127.0.0.1", "--port", str(port), *UVICORN]
    if workers > 1:
        command = [sys.executable, "-c", SERVE_WORKERS, app, str(port), str(workers)]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{app} exited; see {log}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{app} did not start; see {log}")
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def store(kind: str, workdir: Path) -> Iterator[str]:
    import sqlalchemy as sa

    from dispatcher.store.migrate import upgrade_database

    if kind == "sqlite":
        url = f"sqlite:///{workdir / f'receiver-{uuid.uuid4().hex[:6]}.sqlite'}"
        upgrade_database(url)
        yield url
        return
    name = f"bench_receiver_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade_database(url)
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def count_rows(database_url: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(sa.text("SELECT count(*) FROM webhook_deliveries")).scalar_one())
    finally:
        engine.dispose()


def run_store(kind: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import redis

    with private_redis() as broker_url:
        return _run_store(kind, args, workdir, broker_url, redis.Redis.from_url(broker_url))


def _run_store(kind: str, args: argparse.Namespace, workdir: Path, broker_url: str, broker: Any) -> dict[str, Any]:
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_") or k.startswith("DISPATCHER_TEST_")}
    base_env.update(PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'scripts' / 'bench'}")
    bare_rates, receiver_rates, checks = [], [], []
    with store(kind, workdir) as database_url:
        env = {**base_env, "DISPATCHER_API_URL": "http://127.0.0.1:9", "DISPATCHER_ACCOUNT_ID": "1",
               "DISPATCHER_API_TOKEN": "bench-token", "DISPATCHER_DATABASE_URL": database_url,
               "DISPATCHER_BROKER_URL": broker_url, "DISPATCHER_WEBHOOK_SECRETS": SECRET}
        for _ in range(args.rounds):
            with server("receiver:bare_app", base_env, workdir / "bare.log", args.workers) as port:
                bare = drive_load(port, signed_requests(args.requests, port), processes=args.processes,
                                  connections=args.connections, max_seconds=args.max_seconds)
            broker.flushdb()
            rows_before = count_rows(database_url)
            with server("dispatcher.tracking.webhooks.receiver:app_from_environment", env, workdir / "receiver.log",
                        args.workers) as port:
                ours = drive_load(port, signed_requests(args.requests, port), processes=args.processes,
                                  connections=args.connections, max_seconds=args.max_seconds)
            rows, (queued, in_tasks) = count_rows(database_url) - rows_before, _queued_deliveries(broker)
            broker.flushdb()
            bare_rates.append(bare["per_second"])
            receiver_rates.append(ours["per_second"])
            checks.append({"bare": bare, "receiver": ours, "ratio": round(ours["per_second"] / bare["per_second"], 3),
                           "rows_recorded": rows, "tasks_in_broker": queued, "deliveries_in_tasks": in_tasks,
                           "deliveries_per_task": round(in_tasks / queued, 2) if queued else None,
                           "complete": bare["ok"] == ours["ok"] == rows == in_tasks == args.requests})
    # The ratio is the median of per-round ratios: each pair runs back to back, so load from
    # other processes on the machine disturbs both sides of a pair alike.
    return {"store": kind, "bare_per_s": statistics.median(bare_rates),
            "receiver_per_s": statistics.median(receiver_rates),
            "ratio": statistics.median(check["ratio"] for check in checks), "rounds": checks}


def _queued_deliveries(broker: Any) -> tuple[int, int]:
    """The consumer's tasks in the broker's list and the deliveries they carry: a group commit's
    rows go as one ``dispatcher.outcomes`` task (a list of row IDs), a lone row as one
    ``dispatcher.outcome``."""
    tasks = deliveries = 0
    for raw in broker.lrange("dispatcher.outcomes", 0, -1):
        args = json.loads(base64.b64decode(json.loads(raw)["body"]))[0]
        tasks += 1
        deliveries += len(args[0]) if isinstance(args[0], list) else 1
    return tasks, deliveries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10000, help="deliveries per server and round (bounded)")
    parser.add_argument("--store", action="append", choices=["sqlite", "postgres"], help="repeatable; default sqlite")
    parser.add_argument("--rounds", type=int, default=1, help="bare/receiver pairs per store; the median is reported")
    parser.add_argument("--processes", type=int, default=1, help="load-generating processes")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections per load process")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="hard limit of each load phase")
    parser.add_argument("--workers", type=int, default=1,
                        help="uvicorn worker processes of each server, the bare endpoint's and the receiver's alike")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-receiver-") as tmp:
        results = [run_store(kind, args, Path(tmp)) for kind in (args.store or ["sqlite"])]
    print(json.dumps({
        "benchmark": "webhook receiver vs bare Starlette endpoint",
        "requests": args.requests, "processes": args.processes, "connections_per_process": args.connections,
        "server": f"uvicorn, {args.workers} worker process(es), " + " ".join(UVICORN),
        "results": results, "target_ratio": 0.5,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }, indent=2))
    return 0 if all(r["complete"] for result in results for r in result["rounds"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
