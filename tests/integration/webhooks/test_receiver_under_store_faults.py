"""The receiver as a process while its database goes away, hangs or cannot take a write (a table
lock held): liveness stays up, readiness says what is down, /metrics answers, deliveries get a prompt 503 (never a hung request), a slow
body is cut off, and everything is ready again by itself when the database returns.

The database link goes through a TCP proxy (tests/support/tcp_proxy.py) that can be cut (refused)
or frozen (connections open, no byte passes). Two timers are shortened so the test does not wait
out the defaults, and they are the ones under test: the store answer timeout (10 s by default)
and the body read timeout (10 s by default), both 2 s here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from dispatcher.store.migrate import upgrade_database
from tests.conftest import REPO_ROOT
from tests.support.ports import listens
from tests.support.sandbox_process import free_port
from tests.support.tcp_proxy import TcpProxy, tcp_proxy
from tests.support.worker_process import dispatcher_environment, fresh_broker_url, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "receiver-faults-secret"
PATH = "/webhooks/messaging"


@dataclass
class Receiver:
    base: str
    proxy: TcpProxy
    port: int

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.base + path, timeout=15.0, trust_env=False)

    def deliver(self, delivery_id: str) -> httpx.Response:
        body = json.dumps({"event": "message_updated", "id": 4711, "status": "delivered"}).encode()
        timestamp = str(int(time.time()))
        signature = "sha256=" + hmac.new(SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        return httpx.post(self.base + PATH, content=body, timeout=30.0, trust_env=False, headers={
            "Content-Type": "application/json", "X-Chatwoot-Delivery": delivery_id,
            "X-Chatwoot-Timestamp": timestamp, "X-Chatwoot-Signature": signature})


@pytest.fixture()
def receiver(fresh_postgres_url: str, redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch
             ) -> Iterator[Receiver]:
    upgrade_database(fresh_postgres_url)
    direct = sa.engine.make_url(fresh_postgres_url)
    with tcp_proxy(direct.host or "127.0.0.1", direct.port or 5432) as proxy:
        through_proxy = direct.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        env = dispatcher_environment(api_url="http://127.0.0.1:9", database_url=through_proxy,
                                     broker_url=fresh_broker_url(redis_url), DISPATCHER_WEBHOOK_SECRETS=SECRET,
                                     DISPATCHER_RECEIVER_STORE_TIMEOUT_S="2", DISPATCHER_RECEIVER_BODY_TIMEOUT_S="2")
        port = free_port()
        with (tmp_path / "receiver.log").open("wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "dispatcher", "receiver", "--port", str(port)],
                                       cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        served = Receiver(f"http://127.0.0.1:{port}", proxy, port)
        try:
            wait_until(lambda: _answers(served) and listens(process.pid, port), timeout_s=20,
                       what="the receiver's /healthz")
            yield served
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


def _answers(receiver: Receiver) -> bool:
    try:
        return receiver.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def _ready(receiver: Receiver) -> bool:
    return receiver.get("/readyz").status_code == 200


def test_a_store_that_goes_away_or_hangs_gets_prompt_answers_and_readiness_comes_back(receiver: Receiver) -> None:
    assert receiver.get("/readyz").json() == {"database": "ok", "broker": "ok"}
    assert receiver.deliver("faults-before").json() == {"status": "accepted"}

    # the database refuses connections
    receiver.proxy.cut()
    ready = receiver.get("/readyz")
    assert (ready.status_code, ready.json()) == (503, {"database": "down", "broker": "ok"})
    assert receiver.get("/healthz").status_code == 200  # alive: nothing to restart
    metrics = receiver.get("/metrics")
    assert metrics.status_code == 200 and "dispatcher_store_up 0.0" in metrics.text
    refused = receiver.deliver("faults-cut")
    assert (refused.status_code, refused.json()) == (503, {"error": "store_unavailable"})
    receiver.proxy.restore()
    wait_until(lambda: _ready(receiver), timeout_s=30, what="ready again after the cut")
    assert "dispatcher_store_up 1.0" in receiver.get("/metrics").text

    # the database hangs: connections open, nothing answers
    receiver.proxy.freeze()
    hung = receiver.deliver("faults-frozen")  # answered by the receiver's own timeout, not the client's
    assert (hung.status_code, hung.json()) == (503, {"error": "store_unavailable"})
    assert receiver.get("/readyz").status_code == 503
    assert receiver.get("/metrics").status_code == 200
    receiver.proxy.restore()
    wait_until(lambda: _ready(receiver), timeout_s=30, what="ready again after the freeze")
    assert receiver.deliver("faults-after").json() == {"status": "accepted"}


def test_a_store_that_cannot_take_a_write_is_not_ready(receiver: Receiver, fresh_postgres_url: str) -> None:
    # The server answers (SELECT 1 would), but a migration or an operator holds a lock on the
    # deliveries' table: every delivery waits on it, so a load balancer must stop sending here.
    assert _ready(receiver)
    locker = sa.create_engine(fresh_postgres_url)
    try:
        with locker.connect() as connection:
            connection.execute(sa.text("LOCK TABLE webhook_deliveries IN ACCESS EXCLUSIVE MODE"))
            ready = receiver.get("/readyz")  # answered within readiness's bound, by the lock's timeout
            assert (ready.status_code, ready.json()) == (503, {"database": "down", "broker": "ok"})
            assert receiver.get("/healthz").status_code == 200  # alive: nothing to restart
            held = receiver.deliver("faults-locked")  # the store timeout (2 s here) answers it
            assert (held.status_code, held.json()) == (503, {"error": "store_unavailable"})
            connection.rollback()  # the lock goes
        wait_until(lambda: _ready(receiver), timeout_s=30, what="ready again once the lock is gone")
        assert receiver.deliver("faults-unlocked").json() == {"status": "accepted"}
    finally:
        locker.dispose()


def _read_answer(connection: socket.socket) -> bytes:
    """Head and body of one answer: they may come in separate segments (CI met a head alone)."""
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _content_length(answer):
        chunk = connection.recv(4096)
        if not chunk:  # closed: all there is
            break
        answer += chunk
    return answer


def _content_length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def test_a_body_that_does_not_arrive_is_cut_off(receiver: Receiver) -> None:
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=15) as slow:
        slow.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 100\r\n\r\n{\"event\":".encode())
        answer = _read_answer(slow)  # the rest of the body never comes
    assert answer.startswith(b"HTTP/1.1 408"), answer[:60]
    assert b"body_timeout" in answer
