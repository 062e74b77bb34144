"""More workspaces than one (docs/workspaces.md): what each sets apart from the top-level settings,
which are the ``default`` workspace's."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from dispatcher.queues import DEFAULT_WORKSPACE_NAME
from dispatcher.settings.checks import BaseUrl, CallbackUrl, check_whsec, long_token
from dispatcher.settings.routes import Route

DEFAULT_WORKSPACE = DEFAULT_WORKSPACE_NAME  # the workspace of the top-level settings, and of every notification naming none
WORKSPACE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class Workspace(BaseModel):
    """One more workspace the deployment serves (``[workspaces.<name>]``): what differs from the
    top-level settings, which are the ``default`` workspace's. Routes, limits and callbacks left
    out are the default workspace's."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    api_url: BaseUrl
    account_id: int = Field(gt=0)
    api_token: SecretStr
    webhook_secrets: list[SecretStr] = Field(default_factory=list)
    intake_token: SecretStr | None = None  # a host holding it reaches this workspace's notifications only
    routes: dict[str, Route] | None = None
    api_requests_per_minute: int | None = Field(default=None, gt=0)
    contact_searches_per_minute: int | None = Field(default=None, gt=0)
    callback_url: CallbackUrl = Field(default=None, repr=False)
    callback_secrets: list[SecretStr] | None = None

    @field_validator("intake_token")
    @classmethod
    def _intake_token_long(cls, value: SecretStr | None) -> SecretStr | None:
        return long_token(value, turns_off="HTTP intake for this workspace")

    @field_validator("callback_secrets")
    @classmethod
    def _callback_secrets(cls, value: list[SecretStr] | None) -> list[SecretStr] | None:
        for secret in value or []:
            check_whsec(secret.get_secret_value())
        return value


def instance_url(api_url: str) -> str:
    """The instance an API URL reaches, as a key: scheme and host are case-blind, and a default
    port is the same as none (https://x:443 is https://x)."""
    scheme, _, rest = api_url.partition("://")
    host, slash, path = rest.partition("/")
    scheme, host = scheme.lower(), host.lower()
    host = host.removesuffix({"https": ":443", "http": ":80"}.get(scheme, "\0"))
    return f"{scheme}://{host}{slash}{path}".rstrip("/")
