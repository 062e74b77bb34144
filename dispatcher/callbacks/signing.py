"""Standard Webhooks signatures (https://www.standardwebhooks.com/): the headers a host verifies
with any Standard Webhooks library.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the signature is
``v1,<base64 HMAC-SHA256>`` with the secret's bytes (``whsec_`` + base64). While secrets rotate,
the body is signed with each of them, space-separated, so a host holding either verifies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from pydantic import SecretStr


def secret_key(secret: SecretStr | str) -> bytes:
    text = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    return base64.b64decode(text.removeprefix("whsec_"))


def signature(secrets: list[SecretStr], *, webhook_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(secret_key(secret), signed, hashlib.sha256).digest()).decode()
        for secret in secrets
    )


def headers(secrets: list[SecretStr], *, webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secrets, webhook_id=webhook_id, timestamp=timestamp, body=body),
    }
