"""Beside the webhook path, the receiver app serves /metrics and, only with a token, HTTP intake."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.unit.webhooks.conftest import PATH, encode, message_event, running_receiver, signed_headers

EXAMPLE = tomllib.loads((REPO_ROOT / "config" / "dispatcher.example.toml").read_text())
TOKEN = "intake-token-0123456789abcdef"


def test_metrics_count_verdicts(tmp_path: Path) -> None:
    with running_receiver(tmp_path) as receiver:
        body = encode(message_event())
        assert receiver.post(body, signed_headers(body, delivery_id="m-1")).status_code == 200
        assert receiver.post(body, signed_headers(body, delivery_id="m-1")).status_code == 200
        assert receiver.post(body, signed_headers(body, secret="wrong", delivery_id="m-2")).status_code == 401
        text = receiver.client.get("/metrics").text
    assert 'dispatcher_webhook_verdicts_total{verdict="accepted"}' in text
    assert 'dispatcher_webhook_verdicts_total{verdict="duplicate"}' in text
    assert 'dispatcher_webhook_verdicts_total{verdict="bad_signature"}' in text
    assert "dispatcher_notifications" in text


def test_intake_is_off_without_a_token(tmp_path: Path) -> None:
    with running_receiver(tmp_path) as receiver:
        answer = receiver.client.post("/v1/notifications", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code in (404, 405)


def test_intake_is_served_with_a_token(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'dispatcher.sqlite'}"
    with running_receiver(tmp_path, intake_token=TOKEN, database_url=database_url,
                          routes=EXAMPLE["routes"], templates=EXAMPLE["templates"]) as receiver:
        request = {"event_id": "http-1", "route": "sms", "contact": {"identifier": "p-1", "phone_number": "+15550309876"},
                   "content": "Your results are ready"}
        accepted = receiver.client.post("/v1/notifications", json=request, headers={"Authorization": f"Bearer {TOKEN}"})
        refused = receiver.client.post("/v1/notifications", json=request)
        looked_up = receiver.client.get("/v1/notifications/http-1", headers={"Authorization": f"Bearer {TOKEN}"})
        webhook_path_still_works = receiver.client.post(PATH, content=b"{}", headers={}).status_code
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["event_id"] == "http-1"
    assert refused.status_code == 401
    assert looked_up.status_code == 200 and looked_up.json()["route"] == "sms"
    assert webhook_path_still_works in (400, 401)
