"""The deployment's settings: every concern together, and the checks that span concerns.

Values come, highest priority first, from keyword arguments, ``DISPATCHER_*`` environment
variables, the TOML file named by ``DISPATCHER_CONFIG``, then the defaults of each concern's
module. ``config/dispatcher.example.toml`` documents every key; the keys are flat (one namespace),
as deployments have always set them, and each belongs to one concern:

==================  =========================================================
``WorkspaceApi``    the workspace API's address, account, token and HTTP budgets
``Storage``         the database, the broker, the limiter's Redis
``Limits``          call budgets and their shares, tries before setting aside
``Timers``          retries, the sweep, the breaker, deadlines, read-backs
``Routing``         routes, templates, what a failure leads to
``Receiver``        webhooks: signatures, sizes, timeouts
``Intake``          HTTP intake
``Callbacks``       outcome callbacks to the host
``Operators``       the dashboard, Flower, traces, metrics
``Retention``       what is kept, and the key of the hashes kept at rest
==================  =========================================================

A component that needs one concern takes that concern's type (``Settings`` is each of them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, SecretStr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from dispatcher.queues import COUNTDOWN_MARGIN_S, has_visibility_timeout, send_queues
from dispatcher.settings.callbacks import Callbacks
from dispatcher.settings.checks import CONFIG_FILE_VARIABLE, ENV_PREFIX
from dispatcher.settings.intake import Intake
from dispatcher.settings.limits import Limits
from dispatcher.settings.operators import Operators
from dispatcher.settings.receiver import Receiver
from dispatcher.settings.retention import Retention
from dispatcher.settings.routes import Routing, check_routes
from dispatcher.settings.storage import Storage
from dispatcher.settings.timers import Timers
from dispatcher.settings.workspace_api import WorkspaceApi
from dispatcher.settings.workspaces import DEFAULT_WORKSPACE, WORKSPACE_NAME, Workspace, instance_url
from dispatcher.store.account import TOP_LEVEL_INSTANCE, Account


# The concerns stand last first: pydantic takes the fields of the last base first, so the keys (and
# the problems a check names first) come in the order of the table above.
class Settings(BaseSettings, Retention, Operators, Callbacks, Intake, Receiver, Routing, Timers, Limits, Storage,
               WorkspaceApi):
    """Everything the dispatcher reads from its environment. Secrets are ``SecretStr``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        hide_input_in_errors=True,
    )

    # Several workspaces (docs/workspaces.md): the top-level settings are the "default" one's.
    workspaces: dict[str, Workspace] = Field(default_factory=dict)
    # Which workspace these settings are: set by for_workspace, never read from the environment.
    _workspace: str = PrivateAttr(default=DEFAULT_WORKSPACE)
    # Whose instance its account is, for keys at rest (dispatcher.store.account): set by for_workspace.
    _instance: str = PrivateAttr(default=TOP_LEVEL_INSTANCE)

    @model_validator(mode="after")
    def _concerns_agree(self) -> Settings:
        if has_visibility_timeout(self.broker_url) and (
                self.retry_max_countdown_s + COUNTDOWN_MARGIN_S > self.broker_visibility_timeout_s):
            # A countdown that outlives the visibility timeout is delivered to a second worker
            # while the first still holds it: every long retry would run twice.
            raise ValueError(
                f"{ENV_PREFIX}RETRY_MAX_COUNTDOWN_S (retry_max_countdown_s): must be at least "
                f"{COUNTDOWN_MARGIN_S} s below broker_visibility_timeout_s on a Redis broker, or a "
                "countdown outlives the visibility timeout and runs twice")
        if self._calls_back and not self.callback_secrets:
            raise ValueError(f"{ENV_PREFIX}CALLBACK_SECRETS (callback_secrets): callbacks are signed; give a whsec_ secret")
        for name, workspace in self.workspaces.items():
            self._check_workspace(name, workspace)
        return self

    def _check_workspace(self, name: str, workspace: Workspace) -> None:
        if name == DEFAULT_WORKSPACE or not WORKSPACE_NAME.match(name):
            raise ValueError(f"workspaces.{name}: a workspace name is lower-case letters, digits, _ and -, "
                             f"and not {DEFAULT_WORKSPACE!r} (the top-level settings are that one)")
        if workspace.routes is not None:  # a fallback names a route of the workspace's own
            check_routes(workspace.routes, f"workspaces.{name}.routes")
        chosen = self.for_workspace(name)
        if chosen._calls_back and not chosen.callback_secrets:
            raise ValueError(f"workspaces.{name}.callback_secrets: callbacks are signed; give a whsec_ secret "
                             "(the workspace's, or the top-level callback_secrets)")
        if workspace.intake_token is not None and sum(
                token.get_secret_value() == workspace.intake_token.get_secret_value()
                for token in self.intake_tokens().values()) > 1:
            raise ValueError(f"workspaces.{name}.intake_token: each workspace's intake token is its own")
        accounts = [(instance_url(self.api_url), self.account_id),
                    *((instance_url(other.api_url), other.account_id) for other in self.workspaces.values())]
        if accounts.count((instance_url(workspace.api_url), workspace.account_id)) > 1:
            raise ValueError(f"workspaces.{name}.account_id: each workspace is an account of its own "
                             "(another workspace has this account on this api_url)")

    @property
    def hashing_key(self) -> bytes:
        """The key of the keyed hashes kept at rest: ``hash_key``, else the API token."""
        return (self.hash_key or self.api_token).get_secret_value().encode()

    @property
    def _calls_back(self) -> bool:
        """This workspace's own settings name a callback URL (its routes' included)."""
        return self.callback_url is not None or any(route.callback_url for route in self.routes.values())

    @property
    def callbacks_on(self) -> bool:
        """Some URL takes outcome callbacks: the moves then write them (dispatcher.lifecycle.announce)."""
        return self._calls_back or any(self.for_workspace(name).callbacks_on for name in self.workspaces)

    def callback_url_for(self, route: str) -> str | None:
        chosen = self.routes.get(route)
        return (chosen.callback_url if chosen is not None else None) or self.callback_url

    @property
    def workspace_names(self) -> list[str]:
        return [DEFAULT_WORKSPACE, *sorted(self.workspaces)]

    @property
    def send_queues(self) -> list[str]:
        """Every send queue of the deployment, a lane per workspace and priority (docs/priorities.md).
        The top-level settings' list: a workspace's own settings (for_workspace) name no others."""
        return send_queues(self.workspaces)

    def for_workspace(self, name: str | None) -> Settings:
        """The settings of workspace ``name`` (None: the default): the top-level ones, with what the
        workspace sets instead. KeyError for a workspace that is not configured."""
        if name is None or name == self.workspace_name or (name == DEFAULT_WORKSPACE and not self.workspaces):
            return self
        if name == DEFAULT_WORKSPACE:
            return self
        workspace = self.workspaces[name]
        # One key for every keyed hash kept at rest (spent event IDs, contact keys), whichever
        # workspace wrote it: the top level's, even where a workspace's own token would differ.
        update: dict[str, Any] = {"workspaces": {}, "hash_key": self.hash_key or self.api_token, "api_url": workspace.api_url,
                                  "account_id": workspace.account_id, "api_token": workspace.api_token,
                                  "webhook_secrets": workspace.webhook_secrets, "intake_token": workspace.intake_token}
        for key in ("routes", "api_requests_per_minute", "contact_searches_per_minute", "callback_url", "callback_secrets"):
            if getattr(workspace, key) is not None:
                update[key] = getattr(workspace, key)
        chosen = self.model_copy(update=update)
        chosen._workspace = name
        # Accounts of the top-level instance are told apart by their IDs; a workspace on an
        # instance of its own keys its rows by its name as well (its IDs start at 1 again).
        same_instance = instance_url(workspace.api_url) == instance_url(self.api_url)
        chosen._instance = TOP_LEVEL_INSTANCE if same_instance else name
        return chosen

    @property
    def account(self) -> Account:
        """This workspace's account, as the store keys contacts, conversations and opt-outs."""
        return Account(self._instance, self.account_id)

    @property
    def workspace_name(self) -> str:
        return self._workspace

    def intake_tokens(self) -> dict[str, SecretStr]:
        """Each workspace's HTTP intake token, by workspace name (a token reaches its own only)."""
        tokens = {DEFAULT_WORKSPACE: self.intake_token} if self.intake_token is not None else {}
        for name, workspace in self.workspaces.items():
            if workspace.intake_token is not None:
                tokens[name] = workspace.intake_token
        return tokens

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_path = os.environ.get(CONFIG_FILE_VARIABLE)
        if config_path:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_path)))
        return tuple(sources)


