"""Benchmark of the sandbox alone: createMessage calls a second, no faults configured.

Runs the sandbox as a subprocess on a free loopback port (the same launcher the tests use), creates
a set of contacts and conversations over HTTP, then drives createMessage from several load
processes, each with many concurrent keep-alive connections, and prints one JSON line.

The request count is bounded (``--requests``) and so is the run time (``--max-seconds``); traffic goes
to 127.0.0.1 only. Messages are spread over ``--conversations`` conversations because the sandbox,
like the real service, refuses more than 200 messages a minute in one conversation.

The default client is a minimal HTTP/1.1 keep-alive client on asyncio streams, because httpx costs
more CPU per request than the server under test and both share this machine's 2 cores;
``--client httpx`` uses httpx.AsyncClient instead.

    .venv/bin/python scripts/bench/sandbox.py --requests 20000 --processes 1 --connections 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.support.sandbox_process import running_sandbox  # noqa: E402

TOKEN = "sandbox-token-account-1"
API_INBOX = 5
BODY = json.dumps({"content": "Your appointment is tomorrow at 10:00.", "message_type": "outgoing"}).encode()


def prepare(base_url: str, conversations: int) -> list[int]:
    """One contact and one conversation per slot, on the API inbox (no channel rules apply)."""
    ids = []
    headers = {"api_access_token": TOKEN}
    with httpx.Client(base_url=f"{base_url}/api/v1/accounts/1", headers=headers, trust_env=False) as client:
        for n in range(conversations):
            created = client.post("/contacts", json={"inbox_id": API_INBOX, "identifier": f"bench-{n}"})
            created.raise_for_status()
            source_id = created.json()["payload"]["contact_inbox"]["source_id"]
            conv = client.post("/conversations", json={"source_id": source_id, "inbox_id": API_INBOX})
            conv.raise_for_status()
            ids.append(conv.json()["id"])
    return ids


async def _raw_connection(port: int, paths: list[bytes], counts: dict[str, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for path in paths:
            writer.write(
                b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\napi_access_token: " + TOKEN.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(BODY)).encode()
                + b"\r\n\r\n" + BODY
            )
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            counts["ok" if status == 200 else "not_ok"] += 1
    finally:
        writer.close()


async def _httpx_connection(client: httpx.AsyncClient, paths: list[bytes], counts: dict[str, int]) -> None:
    for path in paths:
        response = await client.post(path.decode(), content=BODY, headers={"content-type": "application/json"})
        counts["ok" if response.status_code == 200 else "not_ok"] += 1


async def _drive(port: int, paths: list[bytes], connections: int, client_kind: str, max_seconds: float) -> dict[str, int]:
    counts = {"ok": 0, "not_ok": 0}
    shares = [paths[i::connections] for i in range(connections)]
    if client_kind == "raw":
        jobs = [_raw_connection(port, share, counts) for share in shares]
        await asyncio.wait_for(asyncio.gather(*jobs), timeout=max_seconds)
    else:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        headers = {"api_access_token": TOKEN}
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers=headers, limits=limits, trust_env=False
        ) as client:
            jobs = [_httpx_connection(client, share, counts) for share in shares]
            await asyncio.wait_for(asyncio.gather(*jobs), timeout=max_seconds)
    return counts


def _load_process(port: int, paths: list[bytes], connections: int, client_kind: str, max_seconds: float,
                  start_at: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    time.sleep(max(0.0, start_at - time.time()))
    began = time.perf_counter()
    counts = asyncio.run(_drive(port, paths, connections, client_kind, max_seconds))
    out.put({**counts, "seconds": time.perf_counter() - began})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000, help="total createMessage calls (bounded)")
    parser.add_argument("--processes", type=int, default=1, help="load-generating processes")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections per process")
    parser.add_argument("--conversations", type=int, default=200, help="conversations to spread messages over")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="hard limit of the load phase")
    parser.add_argument("--in-memory", action="store_true",
                        help="keep nothing on disk (default: the state file, as users run it)")
    args = parser.parse_args()
    if args.requests > 200 * args.conversations:
        parser.error("more than 200 messages a conversation would hit the 'Too many messages' limit")

    # The default profile (stock) and, unless --in-memory, a state file: the sandbox as users run it.
    with running_sandbox(extra_args=["--in-memory"] if args.in_memory else []) as sandbox:
        conversation_ids = prepare(sandbox.base_url, args.conversations)
        paths = [
            f"/api/v1/accounts/1/conversations/{conversation_ids[n % len(conversation_ids)]}/messages".encode()
            for n in range(args.requests)
        ]
        ctx = mp.get_context("spawn")
        out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        start_at = time.time() + 1.5  # let every process import and wait at the same line
        procs = [
            ctx.Process(
                target=_load_process,
                args=(sandbox.port, paths[i :: args.processes], args.connections, args.client, args.max_seconds,
                      start_at, out),
            )
            for i in range(args.processes)
        ]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=args.max_seconds + 30) for _ in procs]
        for proc in procs:
            proc.join(timeout=10)
        stored = len(sandbox.messages(inbox_id=API_INBOX))
        calls = sandbox.stats()["calls"].get("createMessage", 0)

    ok = sum(r["ok"] for r in results)
    seconds = max(r["seconds"] for r in results)
    report = {
        "operation": "createMessage",
        "requests": args.requests,
        "ok": ok,
        "not_ok": sum(r["not_ok"] for r in results),
        "seconds": round(seconds, 3),
        "calls_per_second": round(ok / seconds, 1),
        "processes": args.processes,
        "connections_per_process": args.connections,
        "client": args.client,
        "state": "memory" if args.in_memory else "file",
        "server_counted": calls,
        "messages_stored": stored,
    }
    print(json.dumps(report))
    return 0 if report["not_ok"] == 0 and ok == args.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
