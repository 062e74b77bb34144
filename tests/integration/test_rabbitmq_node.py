"""A private RabbitMQ node (tests/support/rabbitmq_node.py) restarts for real: what a durable
queue held is there after a crash, a delivery left unacknowledged by the crash comes again, and
the machine's RabbitMQ on 5672 carries on untouched; and what the dispatcher's enqueuer reports
published survives a crash right after it (publisher confirms). Real processes, no mocks.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection, Queue

from tests.support.rabbitmq_node import PrivateRabbitMQ, private_rabbitmq

# No xdist_group: the node has its own name and free ports, so it runs beside any other test.
pytestmark = pytest.mark.integration

QUEUE = "dispatcher.node-test"  # dispatcher.*: what queued() counts
MACHINE_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _connection(url: str) -> Connection:
    # Publisher confirms: publish() returns once the node has the message on disk, so a kill right
    # after it is a test of the restart, not of a race with the node's write buffer.
    return Connection(url, connect_timeout=5, transport_options={"confirm_publish": True})


def _durable_queue(connection: Connection) -> Queue:
    return Queue(QUEUE, durable=True, auto_delete=False)(connection.default_channel)


def _machine_rabbitmq_answers() -> bool:
    with Connection(MACHINE_RABBITMQ_URL, connect_timeout=5) as connection:
        connection.connect()
        return bool(connection.connected)


def _refuses(port: int) -> bool:
    """Whether nothing listens on the port any more. A node going down may still take a
    connection and reset it: not yet refused, asked again."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except (ConnectionResetError, ConnectionAbortedError, TimeoutError):
        return False
    return False


def _recovered(node: PrivateRabbitMQ) -> dict[str, int]:
    """What a restarted node lists once its durable queue is back: the listing may miss a queue
    still being recovered just after the boot, so it is read again (30 s at most)."""
    deadline = time.monotonic() + 30
    while QUEUE not in (listed := node.queued()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return listed


@pytest.fixture()
def machine_rabbitmq() -> Iterator[None]:
    """The machine's RabbitMQ answers before the test, and still does after it."""
    assert _machine_rabbitmq_answers()
    yield
    assert _machine_rabbitmq_answers()


@pytest.mark.usefixtures("machine_rabbitmq")
def test_a_killed_node_comes_back_with_its_messages_and_redelivers_the_unacknowledged(tmp_path: Path) -> None:
    token = secrets.token_hex(8)
    with private_rabbitmq(log_dir=tmp_path) as node:
        assert node.port != 5672 and not node.node_name.startswith("rabbit@")
        with _connection(node.url) as connection:
            queue = _durable_queue(connection)
            queue.declare()
            connection.Producer().publish({"token": token}, exchange="", routing_key=QUEUE, delivery_mode=2)
        assert node.queued() == {QUEUE: 1, "unacked": 0}

        node.kill()
        with pytest.raises(ConnectionRefusedError), _connection(node.url) as connection:
            connection.connect()
        assert node.queued() == {"unreadable (CalledProcessError)": 0}

        node.start()
        assert _recovered(node) == {QUEUE: 1, "unacked": 0}
        taken = _connection(node.url)
        message = _durable_queue(taken).get(no_ack=False)
        assert message is not None and message.payload == {"token": token}
        assert node.queued() == {QUEUE: 0, "unacked": 1}

        node.kill()  # with the message delivered, not acknowledged: the connection dies with the node
        taken.collect()
        node.start()
        assert _recovered(node) == {QUEUE: 1, "unacked": 0}  # ready again
        with _connection(node.url) as connection:
            again = _durable_queue(connection).get(no_ack=False)
            assert again is not None and again.payload == {"token": token}
            # After a crash the node cannot tell which recovered messages went out: it flags them all.
            assert again.delivery_info["redelivered"] is True
            again.ack()
            assert _durable_queue(connection).get(no_ack=False) is None  # once: nothing else came back
        assert node.queued() == {QUEUE: 0, "unacked": 0}
        port, root = node.port, node.root
    assert _refuses(port)
    assert not root.exists()


ORPHANED_NODE = """
import os, signal
from tests.support.rabbitmq_node import PrivateRabbitMQ
node = PrivateRabbitMQ()
node.start()
print(node.port, node.root, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no stop(), no finally: as a test process killed by its timeout
"""


def test_a_node_does_not_outlive_its_test_process() -> None:
    done = subprocess.run([sys.executable, "-c", ORPHANED_NODE], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == -9, done.stderr[-2000:]
    port_text, root_text = done.stdout.split()
    try:
        deadline = time.monotonic() + 10
        while not _refuses(int(port_text)):
            assert time.monotonic() < deadline, f"the node on {port_text} outlived its test process by 10 s"
            time.sleep(0.1)
    finally:
        shutil.rmtree(root_text, ignore_errors=True)  # what a dead process could not remove


def test_a_send_the_enqueuer_reports_published_survives_a_node_crash_right_after(tmp_path: Path) -> None:
    """The crash issue 20's CI run met: a send task handed straight to a waiting worker, the node
    killed before it wrote the message. Without publisher confirms none of such a burst comes
    back (dispatcher/queues.py); with them, every ID enqueue_send reports published is on disk."""
    from dispatcher.enqueue import CeleryEnqueuer
    from dispatcher.queues import SEND_QUEUE

    ids = list(range(1, 51))
    with private_rabbitmq(log_dir=tmp_path) as node:
        enqueuer = CeleryEnqueuer(node.url)
        worker = Connection(node.url, connect_timeout=5)
        try:
            held: list[object] = []
            channel = worker.channel()
            channel.basic_qos(0, len(ids), False)
            queue = Queue(SEND_QUEUE, durable=True, auto_delete=False)(channel)
            queue.declare()
            queue.consume(callback=held.append)  # a worker that takes every task and acknowledges none

            assert enqueuer.enqueue_send(ids) == ids
            while len(held) < len(ids):  # delivered, not acknowledged: what a crash must not lose
                worker.drain_events(timeout=5)
            node.kill()
        finally:
            worker.collect()
            enqueuer.close()
        node.start()
        assert node.queued() == {SEND_QUEUE: len(ids), "unacked": 0}
