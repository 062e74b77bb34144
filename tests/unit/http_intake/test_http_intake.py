"""The HTTP intake: POST /v1/notifications and GET /v1/notifications/{event_id}.

Success, idempotency (sequential and 50 concurrent twins), conflicts, every refusal of
docs/notifications.md as a 422 naming the field, and the transport-level answers (400, 401, 405,
413, 415, 503). Each refusal stores and queues nothing.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.routing import Mount

from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import ConfigurationError
from dispatcher.intake import http as http_intake
from dispatcher.intake.http import DEFAULT_MAX_BODY_BYTES, create_intake_app, create_intake_routes
from dispatcher.service import Dispatcher
from tests.support.dispatcher_setup import example_settings
from tests.unit.http_intake.conftest import AUTH, CONTENT, PATH, PHONE, TOKEN, Intake, TestClient, valid_request

# --- success -------------------------------------------------------------------------------


def test_a_valid_request_is_accepted_stored_and_queued_once(intake: Intake) -> None:
    response = intake.post(valid_request("appt-1"))

    assert response.status_code == 202
    assert response.json() == {"event_id": "appt-1", "state": "queued", "status_url": "/v1/notifications/appt-1"}
    assert response.headers["location"] == "/v1/notifications/appt-1"
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"
    assert intake.rows() == 1 and intake.payloads() == 1
    assert len(intake.enqueuer.sent) == 1
    stored = intake.dispatcher.status("appt-1")
    assert stored.state == "queued" and stored.route == "reminders" and stored.fallback_route == "sms"


def test_a_scheduled_request_is_stored_but_not_queued(intake: Intake) -> None:
    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    response = intake.post(valid_request("appt-later", send_at=later))
    assert response.status_code == 202
    assert response.json()["state"] == "scheduled"
    assert intake.rows() == 1
    assert intake.enqueuer.sent == []


def test_the_status_url_quotes_an_event_id_with_reserved_characters(intake: Intake) -> None:
    event_id = "clinic/7?appt=2026#1%20x"
    response = intake.post(valid_request(event_id))
    assert response.status_code == 202
    expected = "/v1/notifications/" + quote(event_id, safe="")
    assert response.json()["status_url"] == expected == response.headers["location"]
    assert "/" not in expected.removeprefix("/v1/notifications/")

    fetched = intake.client.get(expected, headers=AUTH)
    assert fetched.status_code == 200
    assert fetched.json()["event_id"] == event_id


def test_the_status_url_includes_the_mount_point(store_url: str, clean_environment: pytest.MonkeyPatch) -> None:
    dispatcher = Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=store_url), enqueuer=ListEnqueuer())
    app = Starlette(routes=[Mount("/intake", routes=create_intake_routes(dispatcher, token=SecretStr(TOKEN)))])
    with TestClient(app) as client:
        response = client.post("/intake/v1/notifications", json=valid_request("appt-m"), headers=AUTH)
        assert response.status_code == 202
        assert response.headers["location"] == "/intake/v1/notifications/appt-m"
        assert client.get(response.headers["location"], headers=AUTH).json()["event_id"] == "appt-m"


# --- idempotency ---------------------------------------------------------------------------


def test_the_same_request_twice_answers_the_same_record_and_stores_it_once(intake: Intake) -> None:
    first = intake.post(valid_request("appt-2"))
    again = intake.post(valid_request("appt-2"))

    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert intake.rows() == 1
    assert len(intake.enqueuer.sent) == 1  # a repeat is not queued again


def test_a_repeat_answers_the_stored_state(intake: Intake) -> None:
    assert intake.post(valid_request("appt-3")).json()["state"] == "queued"
    with intake.dispatcher.sessions.begin() as session:  # a worker has moved it on meanwhile
        from dispatcher.store import queries as store

        notification = store.find_notification_by_event(session, "appt-3")
        assert notification is not None
        notification.state = "sent"
    again = intake.post(valid_request("appt-3"))
    assert again.status_code == 202
    assert again.json() == {"event_id": "appt-3", "state": "sent", "status_url": "/v1/notifications/appt-3"}
    assert len(intake.enqueuer.sent) == 1


def test_fifty_concurrent_identical_posts_store_one_row(intake: Intake) -> None:
    body = valid_request("appt-race")
    start = threading.Barrier(50, timeout=30)

    def post(_: int) -> tuple[int, Any]:
        start.wait()
        response = intake.post(body)
        return response.status_code, response.json()

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(post, range(50), timeout=120))

    assert [status for status, _ in answers] == [202] * 50
    assert all(answer == answers[0][1] for _, answer in answers)
    assert answers[0][1]["event_id"] == "appt-race"
    assert intake.rows() == 1
    assert len(intake.enqueuer.sent) == 1


def test_the_same_event_with_another_request_is_a_conflict(intake: Intake) -> None:
    assert intake.post(valid_request("appt-4")).status_code == 202
    before = intake.dispatcher.status("appt-4")

    response = intake.post(valid_request("appt-4", content="A different text entirely"))

    assert response.status_code == 409
    body = response.json()
    assert body["error"] == "conflict" and body["field"] == "event_id"
    assert "different request" in body["detail"]
    assert "A different text" not in response.text
    assert intake.rows() == 1
    assert intake.dispatcher.status("appt-4") == before
    assert len(intake.enqueuer.sent) == 1


# --- every refusal of docs/notifications.md: 422 naming the field ----------------------------

_PAST = "2020-01-01T00:00:00+00:00"
_FAR = {f"k{n}": n for n in range(21)}

REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown route", {"route": "pigeons"}, "route"),
    ("unknown fallback route", {"fallback_route": "nowhere"}, "fallback_route"),
    ("fallback route equals route", {"fallback_route": "reminders"}, "fallback_route"),
    ("template not registered", {"template__name": "unknown_template"}, "template.name"),
    ("template language not registered", {"template__language": "fr"}, "template.name"),
    ("template category differs", {"template__category": "MARKETING"}, "template.category"),
    ("wrong parameter count", {"template__params": {"1": "only one"}}, "template.params"),
    ("parameters not numbered 1, 2", {"template__params": {"1": "a", "3": "b"}}, "template.params"),
    ("invalid phone", {"contact__phone_number": "5550308877"}, "contact.phone_number"),
    ("phone with spaces", {"contact__phone_number": "+1 555 030"}, "contact.phone_number"),
    ("invalid e-mail", {"contact__email": "not-an-address"}, "contact.email"),
    ("neither identifier nor phone", {"contact": {"name": "Nobody"}}, "contact.identifier"),
    ("free text on a platform route", {"template": ...}, "template"),
    ("sms route without a phone", {"route": "sms", "fallback_route": ..., "template": ...,
                                   "contact": {"identifier": "p-1"}}, "contact.phone_number"),
    ("e-mail route without an address", {"route": "email", "template": ..., "contact": {"identifier": "p-1"}},
     "contact.email"),
    ("fallback to a platform route without a template",
     {"route": "sms", "fallback_route": "reminders", "template": ...}, "fallback_route"),
    ("send_at in the past", {"send_at": _PAST}, "send_at"),
    ("send_at without a zone", {"send_at": "2030-01-01T00:00:00"}, "send_at"),
    ("empty content", {"content": ""}, "content"),
    ("missing content", {"content": ...}, "content"),
    ("content too long", {"content": "x" * 4097}, "content"),
    ("missing event_id", {"event_id": ...}, "event_id"),
    ("empty event_id", {"event_id": ""}, "event_id"),
    ("event_id with a space", {"event_id": "appt 1"}, "event_id"),
    ("missing route", {"route": ...}, "route"),
    ("missing contact", {"contact": ...}, "contact"),
    ("unknown key", {"colour": "blue"}, "colour"),
    ("unknown contact key", {"contact__fax": "123"}, "contact.fax"),
    ("too much metadata", {"metadata": _FAR}, "metadata"),
    ("metadata value not scalar", {"metadata": {"nested": {"a": 1}}}, "metadata.nested*"),
    # what the stores and the workspace cannot keep is refused here, not by a failing insert later
    ("metadata whole number past 64 bits", {"metadata": {"n": 2**64}}, "metadata"),
    ("metadata text with a NUL", {"metadata": {"note": "a\x00b"}}, "metadata"),
    ("content with a NUL", {"content": "Reminder\x00"}, "content"),
    ("contact name with a NUL", {"contact__name": "Ann\x00"}, "contact.name"),
    ("template parameter with a NUL", {"template__params": {"1": "Ann\x00", "2": "Monday"}}, "template.params.1"),
    ("e-mail longer than the workspace keeps", {"contact__email": "a" * 60 + "@" + "b" * 200 + ".com"}, "contact.email"),
]


@pytest.mark.parametrize(("changes", "field"), [(c, f) for _, c, f in REFUSALS], ids=[name for name, _, _ in REFUSALS])
def test_a_refused_request_answers_422_naming_the_field_and_stores_nothing(
    intake: Intake, changes: dict[str, Any], field: str
) -> None:
    response = intake.post(valid_request("appt-bad", **changes))

    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "invalid_request"
    if field.endswith("*"):  # pydantic appends the union member it tried last
        assert body["field"].startswith(field.removesuffix("*")), body
    else:
        assert body["field"] == field, body
    assert isinstance(body["detail"], str) and body["detail"]
    assert set(body) == {"error", "field", "detail"}
    for sent in (v for v in _leaves(changes) if isinstance(v, str) and len(v) > 3):  # nothing sent comes back
        assert sent not in response.text, (sent, body)
    assert intake.rows() == 0 and intake.payloads() == 0
    assert intake.enqueuer.sent == []


def _leaves(value: Any) -> list[Any]:
    """The values a request sent (route names aside: those are the configuration's own words)."""
    if isinstance(value, dict):
        return [leaf for key, item in value.items() if key not in ("route", "fallback_route") for leaf in _leaves(item)]
    return [value]


def test_the_web_session_route_refuses_bulk_use(intake: Intake) -> None:
    cap = intake.dispatcher.settings.routes["web_session"].max_per_minute
    assert cap == 10

    def request(n: int | str) -> dict[str, Any]:
        return {"event_id": f"ws-{n}", "route": "web_session",
                "contact": {"identifier": f"p{n}", "phone_number": PHONE}, "content": "Your visit is confirmed",
                "consent_ref": f"form-{n}"}

    assert [intake.post(request(n)).status_code for n in range(cap)] == [202] * cap
    response = intake.post(request("over"))
    assert response.status_code == 422
    assert response.json()["field"] == "route" and "low volume" in response.json()["detail"]
    assert intake.rows() == cap


@pytest.mark.parametrize("body", [[valid_request()], "a string", 42, None], ids=["array", "string", "number", "null"])
def test_json_that_is_not_an_object_is_refused_as_the_body(intake: Intake, body: Any) -> None:
    response = intake.client.post(PATH, content=json.dumps(body).encode(), headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["field"] == "body"
    assert intake.rows() == 0


# --- transport-level answers ---------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"", b'{"event_id": "a",', b"\xff\xfe{}", b'{"send_at": NaN}', b"[" * 100_000],
    ids=["garbage", "empty", "truncated", "not-utf8", "nan", "deep"],
)
def test_malformed_json_answers_400_naming_the_body(intake: Intake, raw: bytes) -> None:
    if len(raw) > DEFAULT_MAX_BODY_BYTES:
        raw = raw[: DEFAULT_MAX_BODY_BYTES - 1]
    response = intake.client.post(PATH, content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json() == {"error": "malformed_json", "field": "body", "detail": "is not valid JSON"}
    assert intake.rows() == 0


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"Infinity", b"NaN"])
def test_a_metadata_number_json_allows_but_no_store_keeps_is_refused_naming_the_field(
    intake: Intake, number: bytes
) -> None:
    # 1e400 is valid JSON and parses as infinity; PostgreSQL's json refuses it at the insert
    raw = json.dumps(valid_request("appt-inf")).encode().replace(b'"A-77"', number)
    response = intake.client.post(PATH, content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code in (400, 422), response.text
    if response.status_code == 422:
        assert response.json()["field"] == "metadata"
    assert CONTENT not in response.text and PHONE not in response.text
    assert intake.rows() == 0


def test_a_content_length_that_is_not_a_number_answers_400(intake: Intake) -> None:
    response = intake.client.post(PATH, content=b"{}", headers={**AUTH, "Content-Type": "application/json",
                                                                "Content-Length": "abc"})
    assert response.status_code == 400
    assert response.json() == {"error": "malformed_request", "field": "content-length", "detail": "is not a byte count"}


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"])
def test_a_body_that_is_not_declared_json_answers_415(intake: Intake, content_type: str | None) -> None:
    headers = dict(AUTH)
    if content_type is not None:
        headers["Content-Type"] = content_type
    response = intake.client.post(PATH, content=json.dumps(valid_request()).encode(), headers=headers)
    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_media_type"
    assert response.json()["field"] == "content-type"
    assert intake.rows() == 0


def test_json_with_a_charset_parameter_is_accepted(intake: Intake) -> None:
    response = intake.client.post(PATH, content=json.dumps(valid_request()).encode(),
                                  headers={**AUTH, "Content-Type": "Application/JSON; charset=utf-8"})
    assert response.status_code == 202


def test_a_body_at_the_limit_is_read_and_one_byte_more_answers_413(intake: Intake) -> None:
    raw = json.dumps(valid_request("appt-big")).encode()
    at_limit = raw + b" " * (DEFAULT_MAX_BODY_BYTES - len(raw))
    assert len(at_limit) == DEFAULT_MAX_BODY_BYTES
    headers = {**AUTH, "Content-Type": "application/json"}

    over = intake.client.post(PATH, content=at_limit + b" ", headers=headers)
    assert over.status_code == 413
    assert over.json() == {"error": "body_too_large", "field": "body",
                           "detail": f"the request body is limited to {DEFAULT_MAX_BODY_BYTES} bytes"}
    assert intake.rows() == 0

    assert intake.client.post(PATH, content=at_limit, headers=headers).status_code == 202
    assert intake.rows() == 1


def test_a_streamed_body_passing_the_limit_answers_413(intake: Intake) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"event_id": "appt-stream", "content": "'
        for _ in range(20):
            yield b"x" * 8192
        yield b'"}'

    response = intake.client.post(PATH, content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"] == "body_too_large"
    assert intake.rows() == 0


def test_a_smaller_configured_limit_is_honoured(store_url: str, clean_environment: pytest.MonkeyPatch) -> None:
    dispatcher = Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=store_url), enqueuer=ListEnqueuer())
    with TestClient(create_intake_app(dispatcher, token=TOKEN, max_body_bytes=100)) as client:
        response = client.post(PATH, json=valid_request(), headers=AUTH)
    assert response.status_code == 413


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer ", f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer wrong",
     f"Token {TOKEN}", f"{TOKEN}"],
    ids=["missing", "empty", "scheme-only", "scheme-space", "basic", "longer", "shorter", "wrong", "other-scheme", "bare"],
)
def test_a_missing_or_wrong_token_answers_401_and_stores_nothing(intake: Intake, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = intake.post(valid_request("appt-unauth"), headers=headers)

    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["error"] == "unauthorized"
    assert TOKEN not in response.text
    assert intake.rows() == 0
    assert intake.enqueuer.sent == []


def test_the_scheme_is_case_insensitive(intake: Intake) -> None:
    assert intake.post(valid_request(), headers={"Authorization": f"bearer {TOKEN}"}).status_code == 202


def test_authentication_comes_before_anything_about_the_body(intake: Intake) -> None:
    oversized = b"x" * (DEFAULT_MAX_BODY_BYTES + 10)
    assert intake.client.post(PATH, content=oversized, headers={"Content-Type": "text/plain"}).status_code == 401
    assert intake.client.post(PATH, content=b"{", headers={"Content-Type": "application/json"}).status_code == 401


def test_the_token_is_compared_with_compare_digest(intake: Intake, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = http_intake.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(http_intake.hmac, "compare_digest", spy)
    assert intake.post(valid_request(), headers={"Authorization": "Bearer nope"}).status_code == 401
    assert len(calls) == 1
    assert calls[0][1] == hashlib.sha256(TOKEN.encode()).digest()  # equal-length digests: the length is not leaked


@pytest.mark.parametrize("token", ["", "   ", SecretStr("")])
def test_an_empty_token_is_a_configuration_error(intake: Intake, token: str | SecretStr) -> None:
    with pytest.raises(ConfigurationError) as caught:
        create_intake_routes(intake.dispatcher, token=token)
    assert "INTAKE_TOKEN" in caught.value.key


def test_a_wrong_method_answers_405_in_json(intake: Intake) -> None:
    response = intake.client.put(PATH, json=valid_request(), headers=AUTH)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json()["error"] == "method_not_allowed"
    put = intake.client.put(f"{PATH}/appt-1", headers=AUTH)
    assert put.status_code == 405 and put.headers["allow"] == "GET, DELETE, PATCH, POST"
    assert intake.rows() == 0


def test_a_store_failure_answers_503_and_names_no_values(
    tmp_path: Path, clean_environment: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unmigrated = f"sqlite:///{tmp_path}/empty.sqlite"  # no tables: every query fails
    dispatcher = Dispatcher(example_settings(api_url="http://127.0.0.1:9", database_url=unmigrated), enqueuer=ListEnqueuer())
    caplog.set_level("DEBUG", logger="dispatcher")
    with TestClient(create_intake_app(dispatcher, token=TOKEN)) as client:
        posted = client.post(PATH, json=valid_request("appt-db"), headers=AUTH)
        read = client.get(f"{PATH}/appt-db", headers=AUTH)
    for response in (posted, read):
        assert response.status_code == 503
        assert response.json()["error"] == "store_unavailable"
        assert response.headers["retry-after"] == "5"
    assert "OperationalError" in caplog.text
    assert PHONE not in caplog.text


def test_an_unexpected_failure_answers_500_in_json_without_its_message(
    intake: Intake, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"could not reach {PHONE}")

    monkeypatch.setattr(intake.dispatcher, "notify", broken)
    monkeypatch.setattr(intake.dispatcher, "status", broken)
    caplog.set_level("DEBUG", logger="dispatcher")
    for response in (intake.post(valid_request("appt-500")), intake.client.get(f"{PATH}/appt-500", headers=AUTH)):
        assert response.status_code == 500
        assert response.json() == {"error": "internal_error", "detail": "the request could not be handled; try again"}
    assert caplog.text.count("RuntimeError") == 2
    assert PHONE not in caplog.text


# --- GET ---------------------------------------------------------------------------------


def test_a_known_notification_reads_back_as_its_record(intake: Intake) -> None:
    location = intake.post(valid_request("appt-5")).headers["location"]
    response = intake.client.get(location, headers=AUTH)

    assert response.status_code == 200
    assert response.json() == intake.dispatcher.status("appt-5").model_dump(mode="json")
    assert response.json()["state"] == "queued" and response.json()["attempts"] == []
    assert response.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("event_id", ["never-seen", "a" * 201, "x%00y"])
def test_an_unknown_notification_answers_404(intake: Intake, event_id: str) -> None:
    response = intake.client.get(f"{PATH}/{event_id}", headers=AUTH)
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "field": "event_id", "detail": "no notification with this event_id"}


@pytest.mark.parametrize("authorization", [None, "Bearer wrong"], ids=["missing", "wrong"])
def test_reading_needs_the_token_too(intake: Intake, authorization: str | None) -> None:
    intake.post(valid_request("appt-6"))
    headers = {} if authorization is None else {"Authorization": authorization}
    for path in (f"{PATH}/appt-6", f"{PATH}/never-seen"):  # known or not: the same answer
        response = intake.client.get(path, headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "appt-6" not in response.text and "queued" not in response.text
