"""The HTTP intake as a real uvicorn process (``uvicorn --factory
dispatcher.intake.http:app_from_environment``) on loopback, against a fresh PostgreSQL database
and a Redis broker.

Checked: a POST over HTTP answers 202 with the status URL; the row is in PostgreSQL and the send
task (notification ID only) sits in the broker list ``dispatcher.send``; the same POST again
answers the same record and adds neither a row nor a task; GET reads the record back, also for an
event ID with reserved characters; a wrong token and a refused request leave nothing behind; the
process's output holds no phone number, content or token.
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
import sqlalchemy as sa

from dispatcher.store.migrate import upgrade_database
from tests.conftest import REPO_ROOT
from tests.support.ports import listens, stop
from tests.support.sandbox_process import free_port
from tests.support.worker_process import dispatcher_environment, fresh_broker_url, wait_until

pytestmark = pytest.mark.integration

TOKEN = "intake-it-token-8d41f0a2c9"
PHONE = "+15550417733"
CONTENT = "Hello Sam, your dermatology appointment is on Tuesday at 14:30."
SEND_LIST = "dispatcher.send"


def reminder(event_id: str, **changes: Any) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "route": "reminders",
        "contact": {"identifier": "patient-2002", "phone_number": PHONE, "name": "Sam Example"},
        "content": CONTENT,
        "template": {"name": "appointment_reminder", "language": "en", "category": "UTILITY",
                     "params": {"1": "Sam", "2": "Tuesday 14:30"}},
        **changes,
    }


@dataclass
class Intake:
    base_url: str
    engine: sa.Engine
    broker: redis.Redis
    process: subprocess.Popen[bytes]
    log_path: Path

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=10.0, trust_env=False)

    def rows(self) -> list[tuple[int, str, str]]:
        with self.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(
                sa.text("SELECT id, event_id, state FROM notifications ORDER BY id")).all()]

    def payload_count(self) -> int:
        with self.engine.connect() as connection:
            return int(connection.execute(sa.text("SELECT count(*) FROM payloads")).scalar_one())

    def queued_ids(self) -> list[int]:
        ids = []
        for raw in self.broker.lrange(SEND_LIST, 0, -1):
            message = json.loads(raw)
            assert message["headers"]["task"] == "dispatcher.send"
            args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
            assert kwargs == {} and message["headers"]["argsrepr"] == f"(notification={args[0]})"
            ids.append(args[0])
        return sorted(ids)


def _start(env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start uvicorn on a free loopback port; try another port if that one was taken meanwhile."""
    for _ in range(3):
        port = free_port()
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--factory", "dispatcher.intake.http:app_from_environment",
                 "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "info"],
                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _healthy(base_url, process), timeout_s=20.0, what="the intake's /healthz")
        except AssertionError:
            stop(process)
            continue
        return process, base_url
    pytest.fail(f"the intake did not start: {log_path.read_text(errors='replace')[-2000:]}")


def _healthy(base_url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"the intake exited with {process.returncode}")
    try:
        answered = httpx.get(f"{base_url}/healthz", timeout=1.0, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False
    return answered and listens(process.pid, int(base_url.rsplit(":", 1)[1]))  # its own answer




@contextlib.contextmanager
def running_intake(tmp_path: Path, database_url: str, redis_url: str, **overrides: str) -> Iterator[Intake]:
    upgrade_database(database_url)
    broker_url = fresh_broker_url(redis_url)
    broker = redis.Redis.from_url(broker_url)
    env = dispatcher_environment(api_url="http://127.0.0.1:9", database_url=database_url, broker_url=broker_url,
                                 DISPATCHER_INTAKE_TOKEN=TOKEN, **overrides)
    engine = sa.create_engine(database_url)
    log_path = tmp_path / "intake.log"
    process, base_url = _start(env, log_path)
    try:
        yield Intake(base_url, engine, broker, process, log_path)
    finally:
        stop(process)
        engine.dispose()
        broker.flushdb()
        broker.close()


def test_the_intake_process_stores_queues_and_answers_once(tmp_path: Path, fresh_postgres_url: str, redis_url: str) -> None:
    with running_intake(tmp_path, fresh_postgres_url, redis_url) as intake, intake.client() as client:
        # a wrong token and a refused request leave nothing behind
        with intake.client(token="not-the-token") as stranger:
            refused = stranger.post("/v1/notifications", json=reminder("appt-it-1"))
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        invalid = client.post("/v1/notifications", json=reminder("appt-it-bad", route="pigeons"))
        assert invalid.status_code == 422 and invalid.json()["field"] == "route"
        assert intake.rows() == [] and intake.queued_ids() == []

        # a new notification: 202, one row in PostgreSQL, one send task in Redis
        first = client.post("/v1/notifications", json=reminder("appt-it-1"))
        assert first.status_code == 202, first.text
        assert first.json() == {"event_id": "appt-it-1", "state": "queued", "status_url": "/v1/notifications/appt-it-1"}
        assert first.headers["location"] == "/v1/notifications/appt-it-1"
        rows = intake.rows()
        assert [(event_id, state) for _, event_id, state in rows] == [("appt-it-1", "queued")]
        assert intake.payload_count() == 1
        assert intake.queued_ids() == [rows[0][0]]

        # the same POST again: the same record, still one row and one task
        again = client.post("/v1/notifications", json=reminder("appt-it-1"))
        assert again.status_code == 202
        assert again.json() == first.json()
        assert intake.rows() == rows
        assert intake.queued_ids() == [rows[0][0]]

        # another request under the same event ID is a conflict and changes nothing
        conflict = client.post("/v1/notifications", json=reminder("appt-it-1", content="Another text"))
        assert conflict.status_code == 409 and conflict.json()["field"] == "event_id"
        assert intake.rows() == rows

        # GET reads the record back; an unknown ID is 404; no token is 401
        read = client.get(first.headers["location"])
        assert read.status_code == 200
        record = read.json()
        assert record["event_id"] == "appt-it-1" and record["state"] == "queued"
        assert record["route"] == "reminders" and record["fallback_route"] == "sms"
        assert client.get("/v1/notifications/never-seen").status_code == 404
        with intake.client(token=None) as anonymous:
            assert anonymous.get(first.headers["location"]).status_code == 401

        # an event ID with reserved characters round-trips through the real server's path decoding
        odd = "clinic/7?visit=1#a%2F"
        created = client.post("/v1/notifications", json=reminder(odd))
        assert created.status_code == 202
        assert created.headers["location"] == "/v1/notifications/" + quote(odd, safe="")
        fetched = client.get(created.headers["location"])
        assert fetched.status_code == 200 and fetched.json()["event_id"] == odd
        assert len(intake.rows()) == 2 and len(intake.queued_ids()) == 2

    output = intake.log_path.read_text(errors="replace")
    assert "intake appt-it-bad refused: 422 invalid_request (field route)" in output
    for secret in (PHONE, CONTENT, "Another text", TOKEN, "not-the-token"):
        assert secret not in output


def test_a_host_hands_over_a_batch_cancels_and_moves_over_the_real_server(
        tmp_path: Path, fresh_postgres_url: str, redis_url: str) -> None:
    with running_intake(tmp_path, fresh_postgres_url, redis_url) as intake, intake.client() as client:
        odd = "clinic/8?visit=2#b%2F"
        later = "2099-01-01T09:00:00+00:00"
        batch = client.post("/v1/notification-batches", json={"notifications": [
            reminder("batch-it-1"), reminder(odd), reminder("batch-it-bad", route="pigeons"),
            reminder("batch-it-later", send_at=later)]})
        assert batch.status_code == 200, batch.text
        assert [(r["event_id"], r["outcome"], r.get("state") or r.get("field")) for r in batch.json()["results"]] == [
            ("batch-it-1", "accepted", "queued"), (odd, "accepted", "queued"), ("batch-it-bad", "refused", "route"),
            ("batch-it-later", "accepted", "scheduled")]
        assert len(intake.rows()) == 3 and len(intake.queued_ids()) == 2  # the scheduled one waits for the sweep

        cancelled = client.delete("/v1/notifications/" + quote(odd, safe=""))  # no worker runs: it is still queued
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        moved = client.patch("/v1/notifications/batch-it-later", json={"send_at": "2099-02-01T09:00:00+01:00"})
        assert moved.status_code == 200 and moved.json()["send_at"].startswith("2099-02-01T08:00:00")
        too_late = client.patch("/v1/notifications/" + quote(odd, safe=""), json={"send_at": later})
        assert too_late.status_code == 409 and too_late.json()["state"] == "cancelled"
        not_failed = client.post("/v1/notifications/batch-it-1", json=reminder("batch-it-1"))
        assert not_failed.status_code == 409 and not_failed.json()["error"] == "not_retryable"
        assert {event_id: state for _, event_id, state in intake.rows()} == {
            "batch-it-1": "queued", odd: "cancelled", "batch-it-later": "scheduled"}
        assert intake.payload_count() == 2  # the cancelled one's content is gone
    output = intake.log_path.read_text(errors="replace")
    assert PHONE not in output and CONTENT not in output and TOKEN not in output


def test_quiet_hours_hold_a_hand_over_until_the_window_opens(tmp_path: Path, fresh_postgres_url: str,
                                                            redis_url: str) -> None:
    from datetime import UTC, datetime, timedelta

    from tests.support.dispatcher_setup import example_settings

    now = datetime.now(UTC)
    opens = (now + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    routes = example_settings(api_url="http://x").model_dump(mode="json")["routes"]
    routes["reminders"]["send_window"] = f"{opens:%H}:00-{opens + timedelta(hours=1):%H}:00"  # now is outside it
    with running_intake(tmp_path, fresh_postgres_url, redis_url, DISPATCHER_ROUTES=json.dumps(routes)) as intake, \
            intake.client() as client:
        answer = client.post("/v1/notifications", json=reminder("quiet-it-1"))
        assert answer.status_code == 202 and answer.json()["state"] == "scheduled"
        record = client.get(answer.headers["location"]).json()
        assert datetime.fromisoformat(record["send_at"]) == opens
        assert intake.queued_ids() == []  # the sweep releases it when the window opens
