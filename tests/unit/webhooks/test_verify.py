"""verify_delivery: one test per refusal reason, rotation, dialects, the exact timestamp string."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.errors import WebhookRejected
from dispatcher.tracking.webhooks.verify import VerifiedDelivery, verify_delivery

from .conftest import NOW, OLD_SECRET, SECRET, encode, message_event, sign, signed_headers

BODY = encode(message_event())


def verify(headers: dict[str, str], body: bytes = BODY, **options: Any) -> VerifiedDelivery:
    arguments: dict[str, Any] = {"secrets": [SECRET], "prefixes": ["Service"], "window_s": 300, "now": float(NOW)}
    arguments.update(options)
    return verify_delivery(headers, body, **arguments)


def refusal(headers: dict[str, str], body: bytes = BODY, **options: Any) -> tuple[str, int]:
    with pytest.raises(WebhookRejected) as caught:
        verify(headers, body, **options)
    return caught.value.reason, caught.value.status_code


def test_a_correctly_signed_fresh_delivery_verifies() -> None:
    assert verify(signed_headers(BODY, delivery_id="abc-1")) == VerifiedDelivery("abc-1", NOW)


def test_header_names_are_case_insensitive() -> None:
    headers = {key.lower(): value for key, value in signed_headers(BODY).items()}
    assert verify(headers).delivery_id == "d-1"
    headers = {key.upper(): value for key, value in signed_headers(BODY).items()}
    assert verify(headers).delivery_id == "d-1"


def test_upper_case_hex_in_the_signature_verifies() -> None:
    headers = signed_headers(BODY)
    headers["X-Service-Signature"] = "sha256=" + headers["X-Service-Signature"][7:].upper()
    assert verify(headers).timestamp == NOW


# -- one test per refusal reason ------------------------------------------------------------

def test_no_secret_configured() -> None:
    assert refusal(signed_headers(BODY), secrets=[]) == ("no_secret_configured", 503)
    assert refusal(signed_headers(BODY), secrets=[""]) == ("no_secret_configured", 503)


def test_missing_signature_is_401() -> None:
    headers = signed_headers(BODY)
    del headers["X-Service-Signature"]
    assert refusal(headers) == ("missing_header", 401)


@pytest.mark.parametrize("name", ["X-Service-Delivery", "X-Service-Timestamp"])
def test_missing_delivery_id_or_timestamp_is_400(name: str) -> None:
    headers = signed_headers(BODY)
    del headers[name]
    assert refusal(headers) == ("missing_header", 400)


@pytest.mark.parametrize("signature", [
    "", "sha256=", "sha256=abc", "sha1=" + "a" * 64, "SHA256=" + "a" * 64, "sha256=" + "g" * 64,
    "sha256=" + "a" * 65, " sha256=" + "a" * 64, "sha256=" + "a" * 64 + " sha256=" + "b" * 64, "v1," + "a" * 64,
])
def test_malformed_signature_header(signature: str) -> None:
    headers = signed_headers(BODY)
    headers["X-Service-Signature"] = signature
    assert refusal(headers) == ("malformed_header", 400)


@pytest.mark.parametrize("timestamp", [
    "", "abc", "-5", "+" + str(NOW), f" {NOW}", f"{NOW} ", f"{NOW}.0", "1_780_000_000", "１７８０", "1" * 13, "0x6A",
])
def test_malformed_timestamp_header(timestamp: str) -> None:
    # Signed exactly as sent, so only the format can be at fault.
    assert refusal(signed_headers(BODY, timestamp=timestamp)) == ("malformed_header", 400)


@pytest.mark.parametrize("delivery_id", ["", "x" * 201, "has space", "tab\there", "ünïcode"])
def test_malformed_delivery_id(delivery_id: str) -> None:
    assert refusal(signed_headers(BODY, delivery_id=delivery_id)) == ("malformed_header", 400)


def test_a_delivery_id_of_200_characters_is_fine() -> None:
    assert verify(signed_headers(BODY, delivery_id="x" * 200)).delivery_id == "x" * 200


def test_a_header_sent_twice_is_malformed() -> None:
    from starlette.datastructures import Headers

    good = signed_headers(BODY)
    raw = [(key.lower().encode(), value.encode()) for key, value in good.items()]
    raw.append((b"x-service-timestamp", str(NOW + 1).encode()))
    assert refusal(Headers(raw=raw)) == ("malformed_header", 400)


def test_stale_timestamp() -> None:
    assert refusal(signed_headers(BODY, timestamp=str(NOW - 301))) == ("stale_timestamp", 401)
    assert verify(signed_headers(BODY, timestamp=str(NOW - 300))).timestamp == NOW - 300


def test_future_timestamp() -> None:
    assert refusal(signed_headers(BODY, timestamp=str(NOW + 301))) == ("future_timestamp", 401)
    assert verify(signed_headers(BODY, timestamp=str(NOW + 300))).timestamp == NOW + 300


def test_the_window_follows_the_injected_clock() -> None:
    headers = signed_headers(BODY)
    assert refusal(headers, now=NOW + 3600.0) == ("stale_timestamp", 401)
    assert refusal(headers, now=NOW - 3600.0) == ("future_timestamp", 401)
    assert refusal(headers, now=NOW + 31.0, window_s=30) == ("stale_timestamp", 401)


def test_bad_signature_for_a_tampered_body() -> None:
    headers = signed_headers(BODY)
    assert refusal(headers, BODY.replace(b"delivered", b"failed")) == ("bad_signature", 401)
    assert refusal(headers, BODY + b" ") == ("bad_signature", 401)


def test_bad_signature_for_a_wrong_secret() -> None:
    assert refusal(signed_headers(BODY, secret="someone-else")) == ("bad_signature", 401)


def test_the_signature_does_not_cover_the_delivery_id() -> None:
    # Field notes: a retry reuses the ID; the ID is not signed, so the receiver must dedupe on it.
    headers = signed_headers(BODY)
    headers["X-Service-Delivery"] = "another-id"
    assert verify(headers).delivery_id == "another-id"


# -- rotation ------------------------------------------------------------------------------

def test_rotation_old_secret_verifies_while_both_are_configured() -> None:
    headers = signed_headers(BODY, secret=OLD_SECRET)
    assert verify(headers, secrets=[SECRET, OLD_SECRET]).delivery_id == "d-1"
    assert verify(signed_headers(BODY), secrets=[SECRET, OLD_SECRET]).delivery_id == "d-1"
    assert refusal(headers, secrets=[SECRET]) == ("bad_signature", 401)


def test_the_key_is_the_secret_strings_utf8_bytes() -> None:
    secret = "clé-secrète"  # not base64: its own UTF-8 bytes
    assert verify(signed_headers(BODY, secret=secret), secrets=[secret]).timestamp == NOW


# -- dialects ------------------------------------------------------------------------------

def test_chatwoot_headers_with_prefix_chatwoot() -> None:
    headers = signed_headers(BODY, prefix="Chatwoot")
    assert verify(headers, prefixes=["Chatwoot"]).delivery_id == "d-1"


def test_only_the_configured_dialect_is_read() -> None:
    assert refusal(signed_headers(BODY, prefix="Service"), prefixes=["Chatwoot"]) == ("missing_header", 401)
    assert refusal(signed_headers(BODY, prefix="Chatwoot"), prefixes=["Service"]) == ("missing_header", 401)


def test_with_both_dialects_allowed_either_verifies() -> None:
    both = ["Chatwoot", "Service"]
    assert verify(signed_headers(BODY, prefix="Chatwoot", delivery_id="cw"), prefixes=both).delivery_id == "cw"
    assert verify(signed_headers(BODY, prefix="Service", delivery_id="sv"), prefixes=both).delivery_id == "sv"


def test_headers_of_two_dialects_in_one_delivery_are_malformed() -> None:
    # given a correctly signed stock delivery that also carries a contract-dialect delivery id
    headers = signed_headers(BODY, prefix="Chatwoot")
    headers["X-Service-Delivery"] = "other"
    # then which set was signed would be a guess: refused
    assert refusal(headers, prefixes=["Chatwoot", "Service"]) == ("malformed_header", 400)


# -- the exact timestamp string --------------------------------------------------------------

def test_a_leading_zero_is_verified_exactly_as_sent() -> None:
    # Decision: leading zeros are digits like any other; the HMAC covers the header as received.
    padded = "0" + str(NOW)
    assert verify(signed_headers(BODY, timestamp=padded)).timestamp == NOW
    headers = signed_headers(BODY)  # signed over str(NOW) ...
    headers["X-Service-Timestamp"] = padded  # ... but sent with a leading zero: same number, other string
    assert refusal(headers) == ("bad_signature", 401)


def test_a_plus_sign_is_malformed_even_when_signed() -> None:
    assert refusal(signed_headers(BODY, timestamp="+" + str(NOW))) == ("malformed_header", 400)


def test_no_reason_or_message_carries_a_header_value_or_the_body() -> None:
    headers = signed_headers(BODY, secret="wrong")
    with pytest.raises(WebhookRejected) as caught:
        verify(headers)
    text = str(caught.value) + repr(caught.value)
    assert headers["X-Service-Signature"][7:] not in text
    assert "appointment" not in text and SECRET not in text
    assert sign(SECRET, str(NOW), BODY) != headers["X-Service-Signature"]
