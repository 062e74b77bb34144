"""The webhook receiver: which signatures it takes, what it refuses, and how long it waits."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from dispatcher.settings.checks import Concern, SecretList, split_secrets

AUTO_HEADER_PREFIXES = ("Chatwoot", "Service")  # a stock workspace's dialect, the contract's
_HEADER_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9]*(-[A-Za-z0-9]+)*$")


class Receiver(Concern):
    webhook_secrets: SecretList = Field(default_factory=list)
    # "auto": X-Chatwoot-* (a stock workspace) or X-Service-* (the contract), whichever comes.
    webhook_header_prefix: str = "auto"
    webhook_replay_window_s: int = Field(default=300, gt=0, le=3600)
    webhook_max_body_bytes: int = Field(default=1_048_576, gt=0)
    # A body not fully read within this many seconds is refused (408): slow senders are not held.
    receiver_body_timeout_s: float = Field(default=10.0, gt=0)
    # A delivery whose store write has not answered within this many seconds is answered 503 (the
    # write may still land later; a repeat is recognised by its delivery ID).
    receiver_store_timeout_s: float = Field(default=10.0, gt=0)
    # Connections the receiver serves at once; more are answered 503 at once (uvicorn's limit).
    receiver_max_connections: int = Field(default=1000, gt=0)
    webhook_path: str = "/webhooks/messaging"

    @field_validator("webhook_secrets", mode="before")
    @classmethod
    def _split_webhook_secrets(cls, value: Any) -> Any:
        return split_secrets(value)

    @field_validator("webhook_header_prefix")
    @classmethod
    def _header_prefix(cls, value: str) -> str:
        if value.lower() == "auto":
            return "auto"  # any case: "Auto" must not become a header word no delivery carries
        if not _HEADER_PREFIX.match(value):
            raise ValueError("must be auto or a header word such as Service or Chatwoot")
        return value

    @field_validator("webhook_path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/") or "?" in value:
            raise ValueError("must be an absolute path without a query, e.g. /webhooks/messaging")
        return value

    @property
    def webhook_header_prefixes(self) -> tuple[str, ...]:
        """The header dialects the receiver takes: both known ones for ``auto``, else the one named."""
        if self.webhook_header_prefix == "auto":
            return AUTO_HEADER_PREFIXES
        return (self.webhook_header_prefix,)
