"""Verify one webhook delivery: the check, in the order of the Standard Webhooks reference.

1. a secret is configured                          else ``no_secret_configured`` (503)
2. the headers are present (dialect renamed first) else ``missing_header``: 401 for the
   signature (an unsigned delivery), 400 for the delivery id or the timestamp; headers of two
   dialects in one delivery are ``malformed_header`` (400): which set was signed would be a guess
3. the headers are well formed                     else ``malformed_header`` (400):
   delivery id 1-200 visible ASCII characters; timestamp 1-12 ASCII digits (no sign, space,
   underscore or other digits; leading zeros allowed); signature ``sha256=`` + 64 hex digits
4. the timestamp is inside the window, both ways   else ``stale_timestamp`` / ``future_timestamp`` (401)
5. HMAC-SHA256(secret's UTF-8 bytes, raw timestamp header + ``.`` + raw body), compared in
   constant time with every configured secret (rotation)    else ``bad_signature`` (401)

The timestamp is signed exactly as received, never re-formatted: ``0170...`` verifies only if
it was signed as ``0170...``. Nothing here parses the body; JSON comes after this returns.
Every refusal is one :class:`WebhookRejected` whose ``reason`` is a short code that never holds
the body, a header value or a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dispatcher.errors import WebhookRejected

DELIVERY_ID = re.compile(r"[\x21-\x7e]{1,200}")  # the column holds 200; visible ASCII is safe to log
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"sha256=[0-9a-fA-F]{64}")
_NAMES = ("delivery", "timestamp", "signature")


@dataclass(frozen=True, slots=True)
class VerifiedDelivery:
    delivery_id: str
    timestamp: int  # unix seconds, as signed


def dialect_headers(headers: Mapping[str, str], prefixes: Sequence[str]) -> dict[str, str]:
    """``X-<prefix>-Delivery`` etc. (any case) renamed to ``delivery``, ``timestamp``, ``signature``,
    for whichever of ``prefixes`` the delivery uses (a stock workspace says ``Chatwoot``, the
    contract ``Service``).

    A header that comes twice, or headers of two dialects, are refused: which was signed would be a guess.
    """
    wanted = {f"x-{prefix.lower()}-{name}": (prefix.lower(), name) for prefix in prefixes for name in _NAMES}
    found: dict[str, str] = {}
    dialects: set[str] = set()
    items = headers.multi_items() if hasattr(headers, "multi_items") else headers.items()
    for key, value in items:
        hit = wanted.get(key.lower())
        if hit is not None:
            dialect, name = hit
            dialects.add(dialect)
            if name in found or len(dialects) > 1:
                raise WebhookRejected("malformed_header", status_code=400)
            found[name] = value
    return found


def verify_delivery(headers: Mapping[str, str], body: bytes, *, secrets: Sequence[str], prefixes: Sequence[str],
                    window_s: int, now: float) -> VerifiedDelivery:
    """Return the delivery id and timestamp of a genuine delivery; raise WebhookRejected otherwise."""
    keys = [secret.encode("utf-8") for secret in secrets if secret]
    if not keys:
        raise WebhookRejected("no_secret_configured", status_code=503)

    found = dialect_headers(headers, prefixes)
    if "signature" not in found:
        raise WebhookRejected("missing_header", status_code=401)
    if "delivery" not in found or "timestamp" not in found:
        raise WebhookRejected("missing_header", status_code=400)
    delivery_id, timestamp, signature = found["delivery"], found["timestamp"], found["signature"]
    if not (DELIVERY_ID.fullmatch(delivery_id) and _TIMESTAMP.fullmatch(timestamp)
            and _SIGNATURE.fullmatch(signature)):
        raise WebhookRejected("malformed_header", status_code=400)

    signed_at = int(timestamp)
    if now - signed_at > window_s:
        raise WebhookRejected("stale_timestamp")
    if signed_at - now > window_s:
        raise WebhookRejected("future_timestamp")

    message = timestamp.encode("ascii") + b"." + body
    expected = signature[len("sha256="):].lower().encode("ascii")
    matches = [hmac.compare_digest(hmac.new(key, message, hashlib.sha256).hexdigest().encode("ascii"), expected)
               for key in keys]  # every secret, no early exit
    if not any(matches):
        raise WebhookRejected("bad_signature")
    return VerifiedDelivery(delivery_id=delivery_id, timestamp=signed_at)
