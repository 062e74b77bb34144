"""``POST /v1/notification-batches``: a result per item, the field at fault for a refused one (never
its value), the token and the backlog as for a single hand-over."""

from __future__ import annotations

from dispatcher.intake.http import BATCHES_PATH
from tests.unit.http_intake.conftest import AUTH, CONTENT, PHONE, Intake, valid_request


def test_a_batch_answers_a_result_per_item_in_their_order(intake: Intake) -> None:
    bad = valid_request("appt-b2", contact__phone_number="+1-555-BAD-" + PHONE[-4:])
    body = {"notifications": [valid_request("appt-b1"), bad, valid_request("appt-b1"), valid_request("appt-b3")]}
    response = intake.client.post(BATCHES_PATH, json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    results = response.json()["results"]
    assert [(r["index"], r["event_id"], r["outcome"]) for r in results] == [
        (0, "appt-b1", "accepted"), (1, "appt-b2", "refused"), (2, "appt-b1", "duplicate"), (3, "appt-b3", "accepted")]
    assert results[0]["state"] == "queued" and results[1]["field"] == "contact.phone_number"
    assert "BAD" not in response.text and CONTENT not in response.text
    assert intake.rows() == 2 and len(intake.enqueuer.sent) == 2
    assert intake.client.get("/v1/notifications/appt-b3", headers=AUTH).json()["state"] == "queued"


def test_a_batch_needs_the_token_an_object_and_post(intake: Intake) -> None:
    body = {"notifications": [valid_request("appt-b4")]}
    assert intake.client.post(BATCHES_PATH, json=body).status_code == 401
    for wrong in ([valid_request("appt-b4")], {"notifications": valid_request("appt-b4")}, {"items": []}):
        refused = intake.client.post(BATCHES_PATH, json=wrong, headers=AUTH)
        assert (refused.status_code, refused.json()["field"]) == (422, "body")
    too_many = intake.client.post(BATCHES_PATH, json={"notifications": [valid_request("x")] * 1001}, headers=AUTH)
    assert (too_many.status_code, too_many.json()["field"]) == (422, "notifications")
    assert intake.client.get(BATCHES_PATH, headers=AUTH).status_code == 405
    assert intake.rows() == 0
