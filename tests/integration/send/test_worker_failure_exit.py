"""A worker whose event loop fails ends, pool and all, instead of hanging alive.

The chaos run on RabbitMQ met a worker whose main process logged "Unrecoverable error:
UnpicklingError" (a pool child killed halfway through writing a result) and then waited forever
for its pool in a warm stop: a process that hangs alive is never restarted by its supervisor.
Here a real worker meets the same error from the same place (a reader callback of its event
loop, tests/support/torn_pool_result.py) while a task still runs, and must exit with Celery's
failure code within the bound of workers/bounded_stop.py (stale_after_s, 6 s in the integration
tests' FAST_TIMERS), its pool child ended with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
from celery import Celery

from dispatcher.queues import SEND_QUEUE
from tests.support.worker_process import dispatcher_environment, fresh_broker_url, process_group, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CELERY_FAILURE_EXIT = 1  # celery.platforms.EX_FAILURE
HOLD_TASK = "test.hold"  # of tests/support/torn_pool_result.py, which only a worker may import (it loads the app)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_worker_whose_event_loop_fails_exits_with_its_pool_while_a_task_still_runs(
    redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch,
) -> None:
    fifo = tmp_path / "torn-result"
    os.mkfifo(fifo)
    started = tmp_path / "held-task-pid"
    broker_url = fresh_broker_url(redis_url)
    env = dispatcher_environment(api_url="http://127.0.0.1:9", database_url=f"sqlite:///{tmp_path}/store.sqlite",
                                 broker_url=broker_url, TEST_TORN_RESULT_FIFO=str(fifo))
    client = Celery(broker=broker_url)
    try:
        with process_group(env, tmp_path) as group:
            worker = group.start("w", ["-m", "celery", "-A", "workers.app", "worker", "--include",
                                       "tests.support.torn_pool_result", "--queues", SEND_QUEUE, "--concurrency", "1",
                                       "--hostname", "w@%h", "--loglevel", "INFO", "--without-gossip", "--without-mingle"])
            # Given a worker whose one pool child runs a task that will not end by itself
            client.send_task(HOLD_TASK, args=[str(started)], queue=SEND_QUEUE)
            wait_until(lambda: started.exists() and started.read_text() != "", timeout_s=60, what="the held task to start")
            child_pid = int(started.read_text())
            # When its main process meets a torn result in its event loop
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(writer, b"x")
            os.close(writer)
            # Then it exits with the failure code, for its supervisor to start it again
            wait_until(lambda: worker.poll() is not None, timeout_s=90, what="the failed worker to exit")
            assert worker.returncode == CELERY_FAILURE_EXIT
            logs = group.logs()
            assert "Unrecoverable error: UnpicklingError" in logs
            assert "did not stop within 6 s of an unrecoverable error" in logs
            # And its pool child, still inside the task, ended with it
            wait_until(lambda: _gone(child_pid), timeout_s=30, what="the pool child to end")
    finally:
        client.close()
