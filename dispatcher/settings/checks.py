"""The checks that several concerns' settings share. None repeats the value it refuses: that
value may be a token, a password or a secret."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, SecretStr
from pydantic_settings import NoDecode

ENV_PREFIX = "DISPATCHER_"
CONFIG_FILE_VARIABLE = "DISPATCHER_CONFIG"


class Concern(BaseModel):
    """The settings of one concern. ``Settings`` is every concern together, read from one flat
    namespace (``DISPATCHER_*``, the TOML file's top level): the keys users configure stay as they
    were, and a component that needs one concern takes that concern's type."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


def checked_callback_url(value: Any) -> Any:
    """An http(s) URL with a host (the value is never repeated: it may carry a token)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or not re.match(r"^https?://[^/\s?#]+(/[^\s]*)?$", value):
        raise ValueError("must be an http:// or https:// URL")
    return value


CallbackUrl = Annotated[str | None, BeforeValidator(checked_callback_url)]
SecretList = Annotated[list[SecretStr], NoDecode]


def checked_base_url(value: str) -> str:
    value = value.strip().rstrip("/")
    if not re.match(r"^https?://[^/?#\s]+(/[^?#\s]*)?$", value):
        raise ValueError("must be an http(s) base URL without query or fragment")
    if value.endswith("/api/v1") or "/api/v1/" in value:
        raise ValueError("give the base URL without /api/v1; the client adds the API path")
    return value


# The workspace API's base URL, as the top level and each further workspace give it.
BaseUrl = Annotated[str, AfterValidator(checked_base_url)]


def long_token(value: SecretStr | None, *, turns_off: str) -> SecretStr | None:
    """A bearer token or password of ours: at least 16 characters, or unset (``turns_off`` is then off)."""
    if value is not None and len(value.get_secret_value().strip()) < 16:
        raise ValueError(f"must be at least 16 characters (or unset, which turns {turns_off} off)")
    return value


def check_whsec(secret: str) -> None:
    """A Standard Webhooks secret: ``whsec_`` and base64 of 24 to 64 bytes."""
    if not secret.startswith("whsec_"):
        raise ValueError("each secret starts with whsec_ (Standard Webhooks)")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("each secret is whsec_ followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError("each secret holds 24 to 64 bytes")


def empty_is_unset(value: Any) -> Any:
    """An empty variable (compose's ${VAR:-}) means "not set", not "set to nothing"."""
    return None if isinstance(value, str) and not value.strip() else value


def split_secrets(value: Any) -> Any:
    """Several secrets allow rotation: DISPATCHER_WEBHOOK_SECRETS="new,old"."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value
