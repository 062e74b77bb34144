"""HTTP intake (POST /v1/notifications beside the receiver): off while no token is set."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator

from dispatcher.settings.checks import Concern, empty_is_unset, long_token


class Intake(Concern):
    intake_token: SecretStr | None = None
    intake_max_body_bytes: int = Field(default=65_536, gt=0)
    # Notifications waiting for a worker past which HTTP intake answers 429 (0: never); hosts
    # come back after intake_retry_after_s (dispatcher.intake.backlog).
    intake_max_backlog: int = Field(default=20_000, ge=0)
    intake_retry_after_s: int = Field(default=10, gt=0, le=3600)

    @field_validator("intake_token", mode="before")
    @classmethod
    def _intake_empty_is_unset(cls, value: Any) -> Any:
        return empty_is_unset(value)

    @field_validator("intake_token")
    @classmethod
    def _intake_token_present(cls, value: SecretStr | None) -> SecretStr | None:
        return long_token(value, turns_off="HTTP intake")
