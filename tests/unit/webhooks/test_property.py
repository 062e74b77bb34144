"""Property: through the app, every bad request is refused and leaves nothing behind; every
correctly signed fresh one is accepted, recorded once and published once.

Each example draws a genuine delivery (payload, one of the two rotation secrets, a timestamp
inside the window, header-name case) and then one way to spoil it, or none. The oracle is the
contract's rule, not the code under test.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .conftest import NOW, OLD_SECRET, SECRET, Receiver, encode, message_event, running_receiver, sign

WINDOW_S = 300
LIMIT = 4096
PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."
_ids = itertools.count()

SPOILERS = ["none", "tamper", "wrong_secret", "stale", "future", "missing", "malformed_timestamp",
            "malformed_signature", "malformed_delivery", "oversized", "not_an_event", "other_dialect", "unstorable"]
# What a customer may write: any text but a NUL or a lone surrogate, which nothing downstream can store.
STORABLE_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=300)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    directory: Path = tmp_path_factory.mktemp("property")
    with running_receiver(directory, webhook_secrets=[SECRET, OLD_SECRET], webhook_max_body_bytes=LIMIT,
                          webhook_replay_window_s=WINDOW_S) as receiver:
        yield receiver


payloads = st.builds(
    message_event,
    event=st.sampled_from(["message_created", "message_updated"]),
    id=st.integers(1, 2**53),
    status=st.sampled_from(["sent", "delivered", "read", "failed", None]),
    message_type=st.one_of(st.sampled_from(["incoming", "outgoing", "template"]), st.integers(0, 3)),
    content=STORABLE_TEXT,
    created_at=st.one_of(st.integers(0, 2**31), st.just("2026-05-28T20:26:40.000Z")),
)


def header_case(name: str, style: int) -> str:
    return (name, name.lower(), name.upper())[style]


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], tuple[int, ...]]:
    """(spoiler, body, headers, the statuses a refusal may have; () for an accepted delivery)."""
    spoiler = draw(st.sampled_from(SPOILERS))
    body = encode(draw(payloads))
    secret = draw(st.sampled_from([SECRET, OLD_SECRET]))
    timestamp = str(NOW + draw(st.integers(-WINDOW_S, WINDOW_S)))
    delivery_id = f"prop-{next(_ids)}-{draw(st.text(ID_CHARS, max_size=8))}"
    # the receiver's default takes both dialects: the stock one and the contract's
    prefix, expected = draw(st.sampled_from(["Chatwoot", "Service"])), (200,)
    signed_body = body

    if spoiler == "tamper":
        position = draw(st.integers(0, len(body) - 1))
        flip = draw(st.integers(1, 255))
        body = body[:position] + bytes([body[position] ^ flip]) + body[position + 1:]
        expected = (401,)
    elif spoiler == "wrong_secret":
        secret = draw(st.text(min_size=1, max_size=40).filter(lambda s: s not in (SECRET, OLD_SECRET)))
        expected = (401,)
    elif spoiler == "stale":
        timestamp = str(NOW - draw(st.integers(WINDOW_S + 1, NOW)))
        expected = (401,)
    elif spoiler == "future":
        timestamp = str(NOW + draw(st.integers(WINDOW_S + 1, 10**11)))
        expected = (401,)
    elif spoiler == "malformed_timestamp":
        timestamp = draw(st.one_of(
            st.text(PRINTABLE, max_size=20).filter(lambda t: not re.fullmatch(r"[0-9]{1,12}", t)),
            st.sampled_from(["+{}", "-{}", " {}", "{} ", "{}.0", "0x{}", "{}e0", "1_{}", "{}\t"]).map(
                lambda form: form.format(timestamp)),  # near misses of a valid timestamp, signed as sent
        ))
        expected = (400,)
    elif spoiler == "malformed_delivery":
        delivery_id = draw(st.one_of(st.just(""), st.text(PRINTABLE, min_size=1, max_size=10).map(lambda t: t + " x"),
                                     st.text(ID_CHARS, min_size=201, max_size=260)))
        expected = (400,)
    elif spoiler == "oversized":
        body = signed_body = encode(message_event(content="x" * draw(st.integers(LIMIT, 3 * LIMIT))))
        expected = (413,)
    elif spoiler == "not_an_event":
        body = signed_body = draw(st.one_of(
            st.binary(max_size=200).filter(lambda b: not _is_event(b)),
            st.sampled_from([b"[]", b"{}", b'{"event": 1}', b"null", b"1e999", b'{"event":']),
        ))
        expected = (400,)
    elif spoiler == "unstorable":  # signed as sent: the text itself is what cannot be kept
        bad = draw(st.sampled_from(["\x00", "\ud800", "\udfff", "\udc00\ud800"]))
        short = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=50)
        before, after = draw(short), draw(short)  # small enough never to pass the size limit first
        body = signed_body = encode(message_event(content=before + bad + after))
        expected = (400,)
    elif spoiler == "other_dialect":
        prefix = "Acme"  # a dialect the receiver does not take: the signature counts as missing
        expected = (401,)

    if spoiler != "tamper":
        signed_body = body
    signature = sign(secret, timestamp, signed_body)
    if spoiler == "malformed_signature":
        signature = draw(st.one_of(
            st.text(PRINTABLE, max_size=80).filter(lambda s: not re.fullmatch(r"sha256=[0-9a-fA-F]{64}", s)),
            st.sampled_from(["sha1=", "SHA256=", "sha256:", "sha256= "]).map(lambda p: p + signature[7:]),
            st.just(signature[:-1]), st.just(signature + "0"),
        ))
        expected = (400,)
    headers = {f"X-{prefix}-Delivery": delivery_id, f"X-{prefix}-Timestamp": timestamp,
               f"X-{prefix}-Signature": signature}
    if spoiler == "missing":
        name = draw(st.sampled_from(["Delivery", "Timestamp", "Signature"]))
        del headers[f"X-{prefix}-{name}"]
        expected = (401,) if name == "Signature" else (400,)
    style = draw(st.integers(0, 2))
    headers = {header_case(name, style): value for name, value in headers.items()}
    return spoiler, body, headers, expected


def _is_event(body: bytes) -> bool:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(payload, dict) and isinstance(payload.get("event"), str)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request=requests())
def test_only_genuine_fresh_deliveries_are_accepted(app: Receiver, request: tuple[str, bytes, dict[str, str], Any]) -> None:
    spoiler, body, headers, expected = request
    event(spoiler)
    delivery_id = next((value for name, value in headers.items() if name.lower().endswith("-delivery")), "")
    rows_before, published_before = app.count(), list(app.published)

    response = app.post(body, headers)

    assert response.status_code in expected, (spoiler, response.status_code, response.text)
    if spoiler == "none":
        assert response.json() == {"status": "accepted"}
        [row] = app.rows(delivery_id)
        assert app.published == [*published_before, row.id]
    else:
        assert set(response.json()) == {"error"}
        assert app.count() == rows_before
        assert app.published == published_before
