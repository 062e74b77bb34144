"""What is kept, and for how long: settled notifications, spent event IDs, and the key of the
keyed hashes kept at rest."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator

from dispatcher.settings.checks import Concern, empty_is_unset


class Retention(Concern):
    # Settled notifications (delivered, read, failed) unchanged this long are deleted by the
    # periodic retention task, and webhook records this old; nothing still to be sent is deleted.
    retention_days: float = Field(default=30.0, gt=0)
    retention_interval_s: float = Field(default=3600.0, gt=0)
    # A purged notification's event ID stays spent this long (a keyed hash of it, no content), so
    # the same event handed over again is refused instead of sent a second time.
    event_id_spent_days: float = Field(default=365.0, gt=0)
    # The key of the keyed hashes kept at rest (spent event IDs). Unset: the API token is the key;
    # set one of its own to keep the hashes valid across a token rotation (docs/notifications.md).
    hash_key: SecretStr | None = Field(default=None, repr=False)

    @field_validator("hash_key", mode="before")
    @classmethod
    def _hash_key_empty_is_unset(cls, value: Any) -> Any:
        return empty_is_unset(value)
