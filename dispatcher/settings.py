"""The dispatcher's one settings object, and the only reader of the environment.

Values come, highest priority first, from keyword arguments, ``DISPATCHER_*`` environment
variables, the TOML file named by ``DISPATCHER_CONFIG``, then the defaults below.
``config/dispatcher.example.toml`` documents every key.

A wrong or missing value fails at start-up with :class:`~dispatcher.errors.ConfigurationError`
naming the key; the message never repeats the offending value, because that value may be the
API token or a webhook secret.
"""

from __future__ import annotations

import os
import re
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from dispatcher.errors import ConfigurationError
from dispatcher.queues import (
    COUNTDOWN_MARGIN_S,
    DEFAULT_VISIBILITY_TIMEOUT_S,
    DEFAULT_WORKSPACE_NAME,
    Priority,
    has_visibility_timeout,
    send_queues,
)
from dispatcher.store.account import TOP_LEVEL_INSTANCE, Account

ENV_PREFIX = "DISPATCHER_"
SEND_LEASE_MARGIN_S = 5.0  # past the HTTP budget: the commit that records createMessage's answer
CONFIG_FILE_VARIABLE = "DISPATCHER_CONFIG"
DEFAULT_DATABASE_URL = "sqlite:///var/dispatcher.sqlite"
DEFAULT_BROKER_URL = "filesystem://var/broker"  # see docs/embedded-broker.md

AUTO_HEADER_PREFIXES = ("Chatwoot", "Service")  # a stock workspace's dialect, the contract's
_HEADER_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9]*(-[A-Za-z0-9]+)*$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class ChannelKind(StrEnum):
    """What a route's inbox is, which decides what may be sent through it (contract rules 2-5)."""

    MESSAGING_PLATFORM = "messaging_platform"  # business-messaging platform: templates outside the window
    WEB_SESSION = "web_session"  # low volume, expected and consented sends only
    SMS = "sms"
    EMAIL = "email"
    OTHER = "other"  # another provisioned channel (customer rooms, API inboxes)


# Twilio's and the carriers' keywords, and their German forms (issue 19).
DEFAULT_OPT_OUT_KEYWORDS = ("STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "STOPP", "ABMELDEN")
DEFAULT_OPT_IN_KEYWORDS = ("START", "UNSTOP", "YES", "ANMELDEN")


def _checked_callback_url(value: Any) -> Any:
    """An http(s) URL with a host (the value is never repeated: it may carry a token)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or not re.match(r"^https?://[^/\s?#]+(/[^\s]*)?$", value):
        raise ValueError("must be an http:// or https:// URL")
    return value


def _checked_base_url(value: str) -> str:
    value = value.strip().rstrip("/")
    if not re.match(r"^https?://[^/?#\s]+(/[^?#\s]*)?$", value):
        raise ValueError("must be an http(s) base URL without query or fragment")
    if value.endswith("/api/v1") or "/api/v1/" in value:
        raise ValueError("give the base URL without /api/v1; the client adds the API path")
    return value


def _instance_url(api_url: str) -> str:
    """The instance an API URL reaches, as a key: scheme and host are case-blind, and a default
    port is the same as none (https://x:443 is https://x)."""
    scheme, _, rest = api_url.partition("://")
    host, slash, path = rest.partition("/")
    scheme, host = scheme.lower(), host.lower()
    host = host.removesuffix({"https": ":443", "http": ":80"}.get(scheme, "\0"))
    return f"{scheme}://{host}{slash}{path}".rstrip("/")


def _long_token(value: SecretStr | None, *, turns_off: str) -> SecretStr | None:
    """A bearer token or password of ours: at least 16 characters, or unset (``turns_off`` is then off)."""
    if value is not None and len(value.get_secret_value().strip()) < 16:
        raise ValueError(f"must be at least 16 characters (or unset, which turns {turns_off} off)")
    return value


def _check_routes(routes: dict[str, Route], where: str) -> None:
    for name, route in routes.items():
        if not _NAME.match(name):
            raise ValueError(f"{where}.{name}: a route name is lower-case letters, digits, _ . -")
        if route.fallback is not None:
            if route.fallback == name:
                raise ValueError(f"{where}.{name}.fallback: a route cannot fall back to itself")
            if route.fallback not in routes:
                raise ValueError(f"{where}.{name}.fallback: no route named {route.fallback!r}")


def _checked_zone(name: str) -> str:
    from dispatcher.policy.quiet_hours import checked_zone  # here: the policy package imports this module

    return checked_zone(name)


CallbackUrl = Annotated[str | None, BeforeValidator(_checked_callback_url)]


def _check_whsec(secret: str) -> None:
    """A Standard Webhooks secret: ``whsec_`` and base64 of 24 to 64 bytes."""
    import base64
    import binascii

    if not secret.startswith("whsec_"):
        raise ValueError("each secret starts with whsec_ (Standard Webhooks)")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("each secret is whsec_ followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError("each secret holds 24 to 64 bytes")


class Route(BaseModel):
    """A named way to reach a contact: one inbox, its channel kind, and an optional fallback route."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inbox_id: int | None = Field(default=None, gt=0)
    inbox_name: str | None = Field(default=None, min_length=1)
    channel: ChannelKind
    fallback: str | None = None
    template_required: bool = False  # force an approved template even inside the service window
    delivery_deadline_s: float = Field(default=900.0, gt=0)  # not delivered by then: decide on fallback
    max_per_minute: int | None = Field(default=None, gt=0)  # required for web_session routes
    # The lane of its notifications when a request names none (docs/priorities.md): urgent ones go
    # through queues of their own and come first to the rate limits.
    priority: Priority = Priority.NORMAL
    # Recipients decide (docs/opt-outs.md): the category of a notification that names none, and
    # the whole replies, trimmed and in any case, that opt a contact out of / back into this channel.
    category: str = Field(default="service", pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    opt_out_keywords: list[str] = Field(default_factory=lambda: list(DEFAULT_OPT_OUT_KEYWORDS))
    opt_in_keywords: list[str] = Field(default_factory=lambda: list(DEFAULT_OPT_IN_KEYWORDS))
    # Quiet hours (dispatcher.policy.quiet_hours): send only between these times of day ("08:00-20:00"),
    # in the recipient's time zone (the request's contact.time_zone), else time_zone, else default_time_zone.
    send_window: str | None = None
    time_zone: str | None = None
    callback_url: CallbackUrl = Field(default=None, repr=False)  # this route's outcome callbacks go here instead

    @field_validator("send_window")
    @classmethod
    def _window(cls, value: str | None) -> str | None:
        from dispatcher.policy.quiet_hours import SendWindow  # here: the policy package imports this module

        if value is not None:
            SendWindow.parse(value)
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        return _checked_zone(value) if value is not None else None

    @field_validator("opt_out_keywords", "opt_in_keywords")
    @classmethod
    def _keywords(cls, value: list[str]) -> list[str]:
        words = [word.strip().upper() for word in value]
        if any(not word or len(word) > 20 for word in words):
            raise ValueError("keywords are 1 to 20 characters each")
        return words

    @model_validator(mode="after")
    def _one_inbox_selector(self) -> Route:
        if (self.inbox_id is None) == (self.inbox_name is None):
            raise ValueError("give exactly one of inbox_id or inbox_name")
        if set(self.opt_out_keywords) & set(self.opt_in_keywords):
            raise ValueError("a keyword cannot both opt out and opt in")
        if self.channel is ChannelKind.WEB_SESSION and self.max_per_minute is None:
            raise ValueError("a web_session route needs max_per_minute (low volume only)")
        return self

    @property
    def needs_template_outside_window(self) -> bool:
        """Free text is refused outside the customer-service window on the platform (131047)."""
        return self.channel is ChannelKind.MESSAGING_PLATFORM


class Template(BaseModel):
    """An approved template, as registered with the platform owner."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    language: str = Field(min_length=2)
    category: Literal["UTILITY", "MARKETING", "AUTHENTICATION"]
    body_params: int = Field(ge=0, le=100)


SecretList = Annotated[list[SecretStr], NoDecode]


DEFAULT_WORKSPACE = DEFAULT_WORKSPACE_NAME  # the workspace of the top-level settings, and of every notification naming none
WORKSPACE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class Workspace(BaseModel):
    """One more workspace the deployment serves (``[workspaces.<name>]``): what differs from the
    top-level settings, which are the ``default`` workspace's. Routes, limits and callbacks left
    out are the default workspace's."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    api_url: str
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
        return _long_token(value, turns_off="HTTP intake for this workspace")

    @field_validator("api_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return _checked_base_url(value)

    @field_validator("callback_secrets")
    @classmethod
    def _callback_secrets(cls, value: list[SecretStr] | None) -> list[SecretStr] | None:
        for secret in value or []:
            _check_whsec(secret.get_secret_value())
        return value


class Settings(BaseSettings):
    """Everything the dispatcher reads from its environment. Secrets are ``SecretStr``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        hide_input_in_errors=True,
    )

    # The workspace API.
    api_url: str
    account_id: int = Field(gt=0)
    api_token: SecretStr

    # Several workspaces (docs/workspaces.md): the top-level settings are the "default" one's.
    workspaces: dict[str, Workspace] = Field(default_factory=dict)
    # Which workspace these settings are: set by for_workspace, never read from the environment.
    _workspace: str = PrivateAttr(default=DEFAULT_WORKSPACE)
    # Whose instance its account is, for keys at rest (dispatcher.store.account): set by for_workspace.
    _instance: str = PrivateAttr(default=TOP_LEVEL_INSTANCE)

    # Storage and queues.
    # Hidden from repr: a URL may carry a password.
    database_url: str = Field(default=DEFAULT_DATABASE_URL, repr=False)
    broker_url: str = Field(default=DEFAULT_BROKER_URL, repr=False)

    # Outcome callbacks to the host (docs/callbacks.md): events POSTed to callback_url, signed per
    # Standard Webhooks with the first of callback_secrets (whsec_...; every one of them while rotating).
    # A route's own callback_url takes its notifications' events instead. Unset: no callbacks.
    callback_url: CallbackUrl = Field(default=None, repr=False)
    callback_secrets: SecretList = Field(default_factory=list)
    callback_timeout_s: float = Field(default=5.0, gt=0, le=60)
    # An event is delivered at least once, with backoff and jitter, for this long; then it expires.
    callback_max_age_s: float = Field(default=172_800.0, ge=86_400.0)
    # A URL that has failed every delivery for this long is paused, with why, until `dispatcher callbacks retry`.
    callback_pause_after_s: float = Field(default=3_600.0, gt=0)

    # Webhooks.
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

    # HTTP intake (POST /v1/notifications beside the receiver): off while no token is set.
    intake_token: SecretStr | None = None
    intake_max_body_bytes: int = Field(default=65_536, gt=0)
    # Notifications waiting for a worker past which HTTP intake answers 429 (0: never); hosts
    # come back after intake_retry_after_s (dispatcher.intake.backlog).
    intake_max_backlog: int = Field(default=20_000, ge=0)
    intake_retry_after_s: int = Field(default=10, gt=0, le=3600)

    # The operators' dashboard (`dispatcher dashboard`, docs/dashboard.md): its password; off while unset.
    operator_token: SecretStr | None = None
    # Flower's address, for the dashboard's link to it (unset: no link).
    flower_url: str | None = None
    # OpenTelemetry traces, one per notification, exported with OTLP over HTTP to this URL (for
    # example http://127.0.0.1:4318/v1/traces; docs/tracing.md). Unset: no tracing at all.
    otlp_endpoint: str | None = None

    # HTTP to the workspace API. Reads and writes get the same budget: the real service
    # gives up on its own side well before 30 s.
    http_connect_timeout_s: float = Field(default=5.0, gt=0, le=120)
    http_read_timeout_s: float = Field(default=15.0, gt=0, le=300)
    http_write_timeout_s: float = Field(default=15.0, gt=0, le=300)
    http_pool_timeout_s: float = Field(default=5.0, gt=0, le=120)
    http_max_connections: int = Field(default=20, gt=0, le=1000)

    # Sending: shared rate limits, retries, and how long a createMessage call may hold an attempt.
    redis_url: str | None = Field(default=None, repr=False)  # shared limiter; default: the broker when it is Redis
    api_requests_per_minute: int = Field(default=2400, gt=0)  # the service allows 3,000 per client address
    contact_searches_per_minute: int = Field(default=90, gt=0)  # the service allows 100 per account
    # Sends before reads: tracking's status reads (webhooks without a status, read-backs, the
    # deadline's read) may take at most this fraction (0 < f <= 1) of api_requests_per_minute, so
    # that reads after an evening batch never fill the budget new sends need; sends may use all of
    # it. A 429 pauses the reads twice as long as the sends (docs/tracking.md, "Sends before reads").
    reads_fraction_of_api_requests: float = Field(default=0.2, gt=0, le=1)
    # Urgent first, normal never starved (docs/priorities.md): a normal send stands back while an
    # urgent one waits for the same budget, but urgent sends take at most this fraction of each
    # budget (API requests, contact searches) in any minute, so normal sends always keep the rest.
    urgent_fraction_of_api_requests: float = Field(default=0.8, gt=0, lt=1)
    # And this fraction of each budget is kept for urgent sends alone (rounded up: 48 of 2,400
    # requests, 2 of 90 searches): normal sends that spend a minute's budget in its first seconds
    # leave room for an urgent one, which otherwise waits for the window to slide.
    urgent_reserved_fraction: float = Field(default=0.02, ge=0, lt=0.5)
    # A send task that died this many times on one attempt (a crash loop: a killed worker, a bug that
    # kills the process) is set aside as crash_loop until an operator retries it; apart from
    # retry_max_tries, which counts only calls that reached the workspace.
    send_max_runs: int = Field(default=20, gt=0, le=1000)
    retry_max_tries: int = Field(default=12, gt=0, le=100)
    retry_base_s: float = Field(default=1.0, gt=0)
    retry_cap_s: float = Field(default=60.0, gt=0)
    # Longer waits become a due time for the sweep. A countdown is held unacknowledged by the
    # worker that took it, and a Redis broker delivers it again once it outlives the visibility
    # timeout: so it stays below broker_visibility_timeout_s by COUNTDOWN_MARGIN_S (checked below).
    retry_max_countdown_s: float = Field(default=20.0, gt=0)
    sweep_interval_s: float = Field(default=5.0, gt=0)
    # How long a row's task may be unseen before the sweep takes it as lost: a run's lease lapses
    # this long after the run last touched the row (it ended by an exception); a task published
    # and not started is taken as lost this long after its publish, but only while the send queue
    # is empty (a publisher that died before its publish, a broker restarted empty): a row waiting
    # in a backlog keeps its one task however long it waits (issue 44; docs/operations.md, "One
    # task per waiting row"). Short enough that lost work goes on within a minute without a backlog.
    stale_after_s: float = Field(default=45.0, gt=0)
    # The workspace refuses the token or cannot be reached: every worker waits (a circuit breaker),
    # first breaker_base_s, doubling up to breaker_cap_s, then one worker tries again.
    breaker_base_s: float = Field(default=5.0, gt=0)
    breaker_cap_s: float = Field(default=120.0, gt=0)
    # A workspace that answers the calls of this many different notifications in a row (every
    # worker's together) with a 5xx is down: the breaker trips as for a refused token, with
    # error_kind "unavailable" (docs/priorities.md).
    breaker_after_server_errors: int = Field(default=5, gt=0, le=1000)
    # A notification not accepted this long after it was due fails, with the reason it waited for.
    send_deadline_s: float = Field(default=86400.0, gt=0)
    # The time zone of a route's send window when neither the recipient nor the route names one.
    default_time_zone: str = "UTC"
    # Redis broker: a task a worker took and never acknowledged (it was killed whole) comes back
    # after this, plus one restore period (dispatcher.queues): a lost worker's work within 60 s.
    broker_visibility_timeout_s: int = Field(default=DEFAULT_VISIBILITY_TIMEOUT_S, gt=0)

    # Delivery tracking: reconciliation and the single fallback decision.
    # An unconfirmed attempt is read back reconcile_after_s after its last news, then ever less
    # often (a quarter of its age, at most reconcile_max_interval_s apart), until reconcile_horizon_s
    # after its acceptance: a lost webhook's outcome is learned within reconcile_max_interval_s.
    reconcile_after_s: float = Field(default=60.0, gt=0)
    reconcile_max_interval_s: float = Field(default=300.0, gt=0)
    reconcile_horizon_s: float = Field(default=3600.0, gt=0)
    # A webhook delivery the consumer failed to apply this many times is set aside (outcome
    # "set_aside", with its last error): no single event can stop the others.
    delivery_max_tries: int = Field(default=10, gt=0)
    # A status-less webhook (a stock workspace's) is read at once when it is its message's first; one
    # after a read waits until this long after that read, so one read of the conversation answers
    # the burst of events that usually follows a send (docs/tracking.md).
    status_read_wait_s: float = Field(default=2.0, ge=0)
    fallback_codes: list[str] = Field(default_factory=lambda: ["131026"])  # external_error codes that fall back
    no_fallback_codes: list[str] = Field(default_factory=lambda: ["131047", "132000", "132001", "130429"])
    # Web-session routes send only to recipients who consented (contract rule 4): a consent_ref in
    # the request, or consent recorded before. Off only where the host checks consent itself.
    web_session_consent_required: bool = True
    unknown_error_falls_back: bool = True  # a failure with another code, or none

    # Retention: settled notifications (delivered, read, failed) unchanged this long are deleted by
    # the periodic retention task, and webhook records this old; nothing still to be sent is deleted.
    retention_days: float = Field(default=30.0, gt=0)
    retention_interval_s: float = Field(default=3600.0, gt=0)
    # A purged notification's event ID stays spent this long (a keyed hash of it, no content), so
    # the same event handed over again is refused instead of sent a second time.
    event_id_spent_days: float = Field(default=365.0, gt=0)
    # The key of the keyed hashes kept at rest (spent event IDs). Unset: the API token is the key;
    # set one of its own to keep the hashes valid across a token rotation (docs/notifications.md).
    hash_key: SecretStr | None = Field(default=None, repr=False)

    # Metrics: a Prometheus endpoint on the workers (the receiver serves /metrics on its own port).
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 in a container

    # Routes and the template registry.
    routes: dict[str, Route] = Field(default_factory=dict)
    templates: list[Template] = Field(default_factory=list)

    @field_validator("default_time_zone")
    @classmethod
    def _default_zone(cls, value: str) -> str:
        return _checked_zone(value)

    @field_validator("api_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return _checked_base_url(value)

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, value: str) -> str:
        """SQLite or PostgreSQL through psycopg 3 (the driver installed); postgresql:// means that."""
        scheme, separator, rest = value.strip().partition("://")
        if scheme in ("postgresql", "postgres"):
            return f"postgresql+psycopg://{rest}"
        if not separator or scheme not in ("sqlite", "postgresql+psycopg"):
            raise ValueError("must be sqlite:///path/to/file.sqlite or postgresql+psycopg://user@host/database "
                             "(the stores the dispatcher supports)")
        return value.strip()

    @field_validator("api_token")
    @classmethod
    def _token_present(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("intake_token", "metrics_port", "hash_key", "operator_token", "flower_url",
                     "otlp_endpoint", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # An empty variable (compose's ${VAR:-}) means "not set", not "set to nothing".
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("operator_token")
    @classmethod
    def _operator_token_long(cls, value: SecretStr | None) -> SecretStr | None:
        return _long_token(value, turns_off="the dashboard")

    @field_validator("otlp_endpoint", "flower_url")
    @classmethod
    def _plain_http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/?#\s@]+(/[^?#\s]*)?$", value.strip()):
            raise ValueError("must be an http(s) URL without credentials, query or fragment, "
                             "e.g. http://127.0.0.1:4318/v1/traces")
        return value.strip() if value is not None else None

    @field_validator("intake_token")
    @classmethod
    def _intake_token_present(cls, value: SecretStr | None) -> SecretStr | None:
        return _long_token(value, turns_off="HTTP intake")

    @field_validator("callback_secrets")
    @classmethod
    def _callback_secrets(cls, value: list[SecretStr]) -> list[SecretStr]:
        for secret in value:
            _check_whsec(secret.get_secret_value())
        return value

    @field_validator("webhook_secrets", "callback_secrets", mode="before")
    @classmethod
    def _split_secrets(cls, value: Any) -> Any:
        # Several secrets allow rotation: DISPATCHER_WEBHOOK_SECRETS="new,old".
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("webhook_header_prefix")
    @classmethod
    def _header_prefix(cls, value: str) -> str:
        if value.lower() == "auto":
            return "auto"  # any case: "Auto" must not become a header word no delivery carries
        if not _HEADER_PREFIX.match(value):
            raise ValueError("must be auto or a header word such as Service or Chatwoot")
        return value

    @property
    def hashing_key(self) -> bytes:
        """The key of the keyed hashes kept at rest: ``hash_key``, else the API token."""
        return (self.hash_key or self.api_token).get_secret_value().encode()

    @property
    def webhook_header_prefixes(self) -> tuple[str, ...]:
        """The header dialects the receiver takes: both known ones for ``auto``, else the one named."""
        if self.webhook_header_prefix == "auto":
            return AUTO_HEADER_PREFIXES
        return (self.webhook_header_prefix,)

    @field_validator("webhook_path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/") or "?" in value:
            raise ValueError("must be an absolute path without a query, e.g. /webhooks/messaging")
        return value

    @model_validator(mode="after")
    def _routes_and_templates_agree(self) -> Settings:
        _check_routes(self.routes, "routes")
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
            if name == DEFAULT_WORKSPACE or not WORKSPACE_NAME.match(name):
                raise ValueError(f"workspaces.{name}: a workspace name is lower-case letters, digits, _ and -, "
                                 f"and not {DEFAULT_WORKSPACE!r} (the top-level settings are that one)")
            if workspace.routes is not None:  # a fallback names a route of the workspace's own
                _check_routes(workspace.routes, f"workspaces.{name}.routes")
            chosen = self.for_workspace(name)
            if chosen._calls_back and not chosen.callback_secrets:
                raise ValueError(f"workspaces.{name}.callback_secrets: callbacks are signed; give a whsec_ secret "
                                 "(the workspace's, or the top-level callback_secrets)")
            if workspace.intake_token is not None and sum(
                    token.get_secret_value() == workspace.intake_token.get_secret_value()
                    for token in self.intake_tokens().values()) > 1:
                raise ValueError(f"workspaces.{name}.intake_token: each workspace's intake token is its own")
            accounts = [(_instance_url(self.api_url), self.account_id),
                        *((_instance_url(other.api_url), other.account_id) for other in self.workspaces.values())]
            if accounts.count((_instance_url(workspace.api_url), workspace.account_id)) > 1:
                raise ValueError(f"workspaces.{name}.account_id: each workspace is an account of its own "
                                 "(another workspace has this account on this api_url)")
        overlap = set(self.fallback_codes) & set(self.no_fallback_codes)
        if overlap:
            raise ValueError(f"fallback_codes: {sorted(overlap)} also listed in no_fallback_codes")
        seen: set[tuple[str, str]] = set()
        for template in self.templates:
            key = (template.name, template.language)
            if key in seen:
                raise ValueError(f"templates: {template.name!r} in {template.language!r} is listed twice")
            seen.add(key)
        return self

    @property
    def _calls_back(self) -> bool:
        """This workspace's own settings name a callback URL (its routes' included)."""
        return self.callback_url is not None or any(route.callback_url for route in self.routes.values())

    @property
    def callbacks_on(self) -> bool:
        """Some URL takes outcome callbacks: the moves then write them (dispatcher.lifecycle.announce)."""
        return self._calls_back or any(self.for_workspace(name).callbacks_on for name in self.workspaces)

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
        same_instance = _instance_url(workspace.api_url) == _instance_url(self.api_url)
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

    def callback_url_for(self, route: str) -> str | None:
        chosen = self.routes.get(route)
        return (chosen.callback_url if chosen is not None else None) or self.callback_url

    @property
    def limiter_redis_url(self) -> str | None:
        """Where the shared rate limiter lives: redis_url, else a Redis broker, else nowhere."""
        if self.redis_url:
            return self.redis_url
        return self.broker_url if self.broker_url.startswith(("redis://", "rediss://")) else None

    @property
    def http_budget_s(self) -> float:
        """The longest one API call can take: every timeout of its phases together."""
        return self.http_connect_timeout_s + self.http_write_timeout_s + self.http_read_timeout_s + self.http_pool_timeout_s

    @property
    def send_lease_s(self) -> float:
        """How long a createMessage call holds its attempt: the call's whole HTTP budget and a margin
        for recording its answer (45 s at the defaults). No other run looks for its message before
        the lease ends, so a worker killed mid-call delays that notification this long, no more."""
        return self.http_budget_s + SEND_LEASE_MARGIN_S

    def template(self, name: str, language: str) -> Template | None:
        """The registered template with that name and language, or None."""
        for template in self.templates:
            if template.name == name and template.language == language:
                return template
        return None

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


def load_settings(**overrides: Any) -> Settings:
    """Read and check the settings; raise ConfigurationError naming the first bad key."""
    config_path = os.environ.get(CONFIG_FILE_VARIABLE)
    if config_path:
        _check_config_file(Path(config_path))
    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise _configuration_error(error) from None


def _check_config_file(path: Path) -> None:
    if not path.is_file():
        raise ConfigurationError(CONFIG_FILE_VARIABLE, f"no such file: {path}")
    try:
        tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigurationError(CONFIG_FILE_VARIABLE, f"{path} is not valid TOML: {error}") from None


def _configuration_error(error: ValidationError) -> ConfigurationError:
    """Name the key of every problem, and never echo a value (it may be a secret)."""
    named = [_name_problem(problem) for problem in error.errors(include_input=False, include_url=False)]
    key, message = named[0]
    others = "; ".join(f"{other_key}: {other}" for other_key, other in named[1:])
    return ConfigurationError(key, f"{message}; {others}" if others else message)


def _name_problem(problem: Any) -> tuple[str, str]:
    location = [str(part) for part in problem["loc"]]
    message = str(problem["msg"]).removeprefix("Value error, ")
    if problem["type"] == "missing":
        message = "is required but not set"
    if not location:  # a model-level check: its message starts with the key it names
        key, _, rest = message.partition(": ")
        return key, rest or message
    if len(location) == 1:
        return f"{ENV_PREFIX}{location[0].upper()} ({location[0]})", message
    return ".".join(location), message
