"""Outcome callbacks to the host (docs/callbacks.md): events POSTed to callback_url, signed per
Standard Webhooks with the first of callback_secrets (whsec_...; every one of them while rotating).
A route's own callback_url takes its notifications' events instead. Unset: no callbacks."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator

from dispatcher.settings.checks import CallbackUrl, Concern, SecretList, check_whsec, split_secrets


class Callbacks(Concern):
    callback_url: CallbackUrl = Field(default=None, repr=False)
    callback_secrets: SecretList = Field(default_factory=list)
    callback_timeout_s: float = Field(default=5.0, gt=0, le=60)
    # An event is delivered at least once, with backoff and jitter, for this long; then it expires.
    callback_max_age_s: float = Field(default=172_800.0, ge=86_400.0)
    # A URL that has failed every delivery for this long is paused, with why, until `dispatcher callbacks retry`.
    callback_pause_after_s: float = Field(default=3_600.0, gt=0)

    @field_validator("callback_secrets", mode="before")
    @classmethod
    def _split_callback_secrets(cls, value: Any) -> Any:
        return split_secrets(value)

    @field_validator("callback_secrets")
    @classmethod
    def _callback_secrets(cls, value: list[SecretStr]) -> list[SecretStr]:
        for secret in value:
            check_whsec(secret.get_secret_value())
        return value
