"""The receiver app through Starlette's TestClient, a SQLite store and a list as the publisher."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.tracking.webhooks.deliveries import NewDelivery

from .conftest import CONTENT, NOW, OLD_SECRET, PATH, PHONE, SECRET, Receiver, encode, message_event, running_receiver, sign, signed_headers

BODY = encode(message_event())


def test_a_signed_delivery_is_recorded_once_and_published(receiver: Receiver) -> None:
    # given a correctly signed, fresh delivery
    headers = signed_headers(BODY, delivery_id="dlv-1")
    # when it arrives
    response = receiver.post(BODY, headers)
    # then it is accepted, stored with its summary, and its row ID is published
    assert (response.status_code, response.json()) == (200, {"status": "accepted"})
    [row] = receiver.rows("dlv-1")
    assert row.event == "message_updated"
    stored = json.loads(row.summary) if isinstance(row.summary, str) else row.summary
    assert stored["message_id"] == 4711 and stored["status"] == "delivered"
    assert stored["conversation_display_id"] == 17 and stored["contact_id"] == 33
    assert receiver.published == [row.id]


def test_a_retried_delivery_id_is_acknowledged_and_dropped(receiver: Receiver) -> None:
    assert receiver.post(BODY, signed_headers(BODY, delivery_id="dlv-2")).status_code == 200
    # the service retries with the same delivery ID, a fresh timestamp and signature
    receiver.clock.now += 7
    retry = signed_headers(BODY, delivery_id="dlv-2", timestamp=str(NOW + 7))
    response = receiver.post(BODY, retry)
    assert (response.status_code, response.json()) == (200, {"status": "duplicate"})
    assert len(receiver.rows("dlv-2")) == 1
    assert len(receiver.published) == 1


def test_stock_dialect_with_prefix_chatwoot(tmp_path: Path) -> None:
    with running_receiver(tmp_path, webhook_header_prefix="Chatwoot") as receiver:
        stock = receiver.post(BODY, signed_headers(BODY, prefix="Chatwoot", delivery_id="cw-1"))
        contract = receiver.post(BODY, signed_headers(BODY, prefix="Service", delivery_id="sv-1"))
        assert stock.status_code == 200 and contract.status_code == 401
        assert [row.delivery_id for row in receiver.rows()] == ["cw-1"]


def test_by_default_both_dialects_are_taken(tmp_path: Path) -> None:
    with running_receiver(tmp_path) as receiver:
        stock = receiver.post(BODY, signed_headers(BODY, prefix="Chatwoot", delivery_id="cw-1"))
        contract = receiver.post(BODY, signed_headers(BODY, prefix="Service", delivery_id="sv-1"))
        assert stock.status_code == 200 and contract.status_code == 200
        assert sorted(row.delivery_id for row in receiver.rows()) == ["cw-1", "sv-1"]


def test_rotation_through_the_app(tmp_path: Path) -> None:
    old_signed = signed_headers(BODY, secret=OLD_SECRET, delivery_id="rot-1")
    with running_receiver(tmp_path / "both", webhook_secrets=[SECRET, OLD_SECRET]) as both:
        assert both.post(BODY, old_signed).status_code == 200
    with running_receiver(tmp_path / "new", webhook_secrets=[SECRET]) as only_new:
        assert only_new.post(BODY, old_signed).json() == {"error": "bad_signature"}
        assert only_new.rows() == []


def test_bad_signature_with_malformed_json_is_401_not_400(receiver: Receiver) -> None:
    garbage = b'{"event": "message_updated", '
    headers = signed_headers(garbage, secret="not-ours")
    response = receiver.post(garbage, headers)
    assert (response.status_code, response.json()) == (401, {"error": "bad_signature"})


@pytest.mark.parametrize("body", [b'{"event": ', b"[1, 2]", b'"text"', b"\xff\xfe", b"[" * 100_000, b'{"id": 1}',
                                  b"", b"null"])
def test_malformed_body_after_a_good_signature_is_400(receiver: Receiver, body: bytes) -> None:
    response = receiver.post(body, signed_headers(body, delivery_id="bad-body"))
    assert (response.status_code, response.json()) == (400, {"error": "malformed_body"})
    assert receiver.rows() == [] and receiver.published == []


def test_content_length_over_the_limit_is_413_before_reading(tmp_path: Path) -> None:
    with running_receiver(tmp_path, webhook_max_body_bytes=1000) as receiver:
        big = encode(message_event(content="x" * 2000))
        response = receiver.post(big, signed_headers(big))
        assert (response.status_code, response.json()) == (413, {"error": "body_too_large"})
        exactly = b" " * (1000 - len(BODY)) + BODY  # leading whitespace is valid JSON
        assert receiver.post(exactly, signed_headers(exactly)).status_code == 200


def test_a_streamed_body_passing_the_limit_is_413(tmp_path: Path) -> None:
    with running_receiver(tmp_path, webhook_max_body_bytes=1000) as receiver:
        big = encode(message_event(content="x" * 2000))

        def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
            for start in range(0, len(big), 256):
                yield big[start:start + 256]

        response = receiver.client.post(PATH, content=chunks(), headers=signed_headers(big))
        assert (response.status_code, response.json()) == (413, {"error": "body_too_large"})
        assert receiver.rows() == []


def test_every_refusal_answers_json_with_the_reason_only(receiver: Receiver) -> None:
    cases = {
        "missing_header": ({}, 401),
        "stale_timestamp": (signed_headers(BODY, timestamp=str(NOW - 1000)), 401),
        "future_timestamp": (signed_headers(BODY, timestamp=str(NOW + 1000)), 401),
        "bad_signature": (signed_headers(BODY + b" "), 401),
        "malformed_header": (signed_headers(BODY, timestamp="x"), 400),
    }
    for reason, (headers, status) in cases.items():
        response = receiver.post(BODY, headers)
        assert (response.status_code, response.json()) == (status, {"error": reason}), reason
    assert receiver.rows() == [] and receiver.published == []


def test_no_secret_configured_refuses_everything(tmp_path: Path) -> None:
    with running_receiver(tmp_path, webhook_secrets=[]) as receiver:
        response = receiver.post(BODY, signed_headers(BODY))
        assert (response.status_code, response.json()) == (503, {"error": "no_secret_configured"})


def test_a_publish_failure_still_answers_200_and_keeps_the_row(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def broker_down(row_id: int) -> None:
        raise ConnectionError("broker down")

    with running_receiver(tmp_path, publish=broker_down) as receiver, caplog.at_level(logging.WARNING):
        response = receiver.post(BODY, signed_headers(BODY, delivery_id="pub-1"))
        assert (response.status_code, response.json()) == (200, {"status": "accepted"})
        assert len(receiver.rows("pub-1")) == 1
    assert "could not publish webhook deliveries pub-1: ConnectionError" in caplog.text and "ConnectionError" in caplog.text


def test_a_store_failure_answers_503(tmp_path: Path) -> None:
    with running_receiver(tmp_path) as receiver:
        with receiver.sessions() as session:
            session.connection().exec_driver_sql("DROP TABLE webhook_deliveries")
            session.commit()
        response = receiver.post(BODY, signed_headers(BODY))
        assert (response.status_code, response.json()) == (503, {"error": "store_unavailable"})
        assert receiver.published == []


class HandOverPublisher:
    """A publisher that, as the Celery one, takes deliveries the store could not record."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.handed_over: list[NewDelivery] = []

    def __call__(self, row_id: int) -> None:
        self.rows.append(row_id)

    def publish_unrecorded(self, deliveries: list[NewDelivery]) -> None:
        self.handed_over.extend(deliveries)


def test_a_delivery_the_store_cannot_take_is_handed_over_whole_with_nothing_private(tmp_path: Path) -> None:
    publisher = HandOverPublisher()
    with running_receiver(tmp_path, publish=publisher) as receiver:
        with receiver.sessions() as session:
            session.connection().exec_driver_sql("DROP TABLE webhook_deliveries")
            session.commit()
        response = receiver.post(BODY, signed_headers(BODY, delivery_id="away-1"))
        assert (response.status_code, response.json()) == (503, {"error": "store_unavailable"})
    [delivery] = publisher.handed_over
    argument = delivery.as_task_argument()
    # what the store would have kept: the event, the message, its status and the body's keyed hash
    assert (argument["delivery_id"], argument["event"], argument["summary"]["message_id"]) == ("away-1", "message_updated",
                                                                                             message_event()["id"])
    assert argument["summary"]["body_digest"] and NewDelivery.from_task_argument(argument) == delivery
    assert CONTENT not in json.dumps(argument) and PHONE not in json.dumps(argument)
    assert publisher.rows == []


def test_healthz(receiver: Receiver) -> None:
    response = receiver.client.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_only_post_on_the_webhook_path(receiver: Receiver) -> None:
    assert receiver.client.get(PATH).status_code == 405
    assert receiver.client.post("/elsewhere", content=BODY, headers=signed_headers(BODY)).status_code == 404


def test_logs_name_reason_and_delivery_id_never_body_signature_or_secret(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    bad = signed_headers(BODY, secret="forged", delivery_id="log-1")
    with caplog.at_level(logging.DEBUG, logger="dispatcher"):
        receiver.post(BODY, bad)
        receiver.post(BODY, signed_headers(BODY, delivery_id="log-2"))
        receiver.post(BODY, signed_headers(BODY, delivery_id="log-2"))
        receiver.post(BODY, {**signed_headers(BODY), "X-Service-Delivery": "evil\x7fid"})
    text = caplog.text
    assert "webhook delivery log-1 refused: bad_signature (401)" in text
    assert "webhook delivery - refused: malformed_header (400)" in text
    assert "duplicate webhook delivery log-2" in text
    for private in (CONTENT, PHONE, SECRET, bad["X-Service-Signature"][7:], sign(SECRET, str(NOW), BODY)[7:], "evil"):
        assert private not in text


class BatchPublisher:
    """A publisher with ``publish_many``, as the Celery one: records each batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, row_id: int) -> None:
        self.publish_many([row_id])

    def publish_many(self, row_ids: list[int]) -> None:
        self.batches.append(list(row_ids))


def test_a_status_less_update_is_published_at_once_for_its_first_read(tmp_path: Path) -> None:
    # given a stock workspace's message_updated (no status) and a contract one (with a status)
    publisher = BatchPublisher()
    stock = encode({key: value for key, value in message_event().items() if key != "status"})
    with running_receiver(tmp_path, publish=publisher, status_read_wait_s=2.0) as receiver:
        # when both arrive
        assert receiver.post(stock, signed_headers(stock, delivery_id="stock-1")).status_code == 200
        assert receiver.post(BODY, signed_headers(BODY, delivery_id="contract-1")).status_code == 200
        [stock_row], [contract_row] = receiver.rows("stock-1"), receiver.rows("contract-1")
    # then both tasks run at once: the consumer reads a message's first status-less update at once
    # (a late "sent" must have the least time to overwrite it) and coalesces only the later ones
    assert publisher.batches == [[stock_row.id], [contract_row.id]]
