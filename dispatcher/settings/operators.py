"""What operators look through: the dashboard, Flower's link, traces and metrics."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, SecretStr, field_validator

from dispatcher.settings.checks import Concern, empty_is_unset, long_token


class Operators(Concern):
    # The operators' dashboard (`dispatcher dashboard`, docs/dashboard.md): its password; off while unset.
    operator_token: SecretStr | None = None
    # Flower's address, for the dashboard's link to it (unset: no link).
    flower_url: str | None = None
    # OpenTelemetry traces, one per notification, exported with OTLP over HTTP to this URL (for
    # example http://127.0.0.1:4318/v1/traces; docs/tracing.md). Unset: no tracing at all.
    otlp_endpoint: str | None = None
    # Metrics: a Prometheus endpoint on the workers (the receiver serves /metrics on its own port).
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 in a container

    @field_validator("operator_token", "flower_url", "otlp_endpoint", "metrics_port", mode="before")
    @classmethod
    def _operators_empty_is_unset(cls, value: Any) -> Any:
        return empty_is_unset(value)

    @field_validator("operator_token")
    @classmethod
    def _operator_token_long(cls, value: SecretStr | None) -> SecretStr | None:
        return long_token(value, turns_off="the dashboard")

    @field_validator("otlp_endpoint", "flower_url")
    @classmethod
    def _plain_http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/?#\s@]+(/[^?#\s]*)?$", value.strip()):
            raise ValueError("must be an http(s) URL without credentials, query or fragment, "
                             "e.g. http://127.0.0.1:4318/v1/traces")
        return value.strip() if value is not None else None
