"""The sandbox's configuration: the profile, seed data, and behaviour, webhook and fault settings, from TOML.

One file format serves both the shipped default seed (``seed.default.toml``) and ``--config FILE``.
Merging rule, kept simple so a test config can be three lines long:

* if the file defines ``accounts``, the whole seed (accounts, tokens, inboxes, contacts,
  recipient_rules) comes from the file alone; otherwise the default seed is used;
* the tables ``[behaviour]``, ``[webhooks]`` and ``[faults.<operationId>]`` are merged key by key
  over the default file's tables; keys left out keep the model defaults below, except the four
  profile settings (``PROFILE_SETTINGS``), which come from the chosen profile;
* ``profile`` (``stock`` or ``contract``): the command line's ``--profile``, else the file's, else
  the default file's.

Every key is documented in docs/sandbox.md. Units are in the names (``_s`` seconds, ``_share`` 0..1).
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox.profiles import DEFAULT_PROFILE, PROFILES, Profile, ProfileName

SEED_KEYS = ("accounts", "tokens", "inboxes", "contacts", "recipient_rules")
# Settings whose default comes from the profile when a file leaves them out: (table, key, field).
PROFILE_SETTINGS = (
    ("webhooks", "header_prefix", "header_prefix"),
    ("webhooks", "include_status", "event_status"),
    ("webhooks", "max_retries", "webhook_retries"),
    ("behaviour", "contact_search_per_minute", "contact_search_per_minute"),
)
OPERATION_IDS = (
    "listInboxes",
    "searchContacts",
    "createContact",
    "listContactableInboxes",
    "listConversations",
    "createConversation",
    "listMessages",
    "createMessage",
    "listWebhooks",
    "createWebhook",
)
CHANNEL_PLATFORM = "Channel::Whatsapp"
CHANNEL_API = "Channel::Api"
CHANNEL_SMS = "Channel::Sms"
CHANNEL_EMAIL = "Channel::Email"
CHANNEL_WEB_SESSION = "Channel::WebSession"
CHANNEL_WEB_WIDGET = "Channel::WebWidget"


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a config file must not be silently ignored."""

    model_config = ConfigDict(extra="forbid")


class Account(_Strict):
    id: int
    name: str


class Token(_Strict):
    token: str
    accounts: list[int]


class Template(_Strict):
    """An approved platform template; ``body_params`` is the number of body placeholders."""

    name: str
    language: str
    category: Literal["UTILITY", "MARKETING", "AUTHENTICATION"] = "UTILITY"
    body_params: int = Field(0, ge=0)


class Inbox(_Strict):
    id: int
    account_id: int
    name: str
    channel_type: str
    lock_to_single_conversation: bool = False
    sends_per_minute: int | None = Field(None, ge=1, description="cap of outgoing sends a minute")
    templates: list[Template] = []


class Contact(_Strict):
    id: int | None = None
    account_id: int
    name: str | None = None
    phone_number: str | None = None
    email: str | None = None
    identifier: str | None = None
    sms_opted_out: bool = False  # replied STOP to the SMS provider: sends fail 21610
    marketing_opted_out: bool = False  # stopped marketing on the platform: marketing templates fail 131050


class RecipientRule(_Strict):
    """Outcome for outgoing messages to phones starting with ``phone_prefix`` on ``inbox_ids``.

    ``regress``: delivered, then a late ``sent`` (the provider's callbacks out of order), then read;
    with ``then_read = false`` nothing follows the late ``sent``: the recipient has the message, the
    workspace says ``sent`` for good.
    """

    phone_prefix: str
    inbox_ids: list[int] = []
    effect: Literal["fail", "never_confirm", "regress"] = "fail"
    external_error: str = "131026: Message undeliverable"
    then_read: bool = True

    @model_validator(mode="after")
    def _read_only_after_regress(self) -> RecipientRule:
        if not self.then_read and self.effect != "regress":
            raise ValueError("then_read = false applies to effect = \"regress\" only")
        return self


class Behaviour(_Strict):
    initial_status: Literal["sent", "null"] = "sent"
    delivered_after_s: float = Field(0.5, ge=0)
    read_after_s: float = Field(1.5, ge=0, description="after delivered")
    failed_after_s: float = Field(0.2, ge=0, description="asynchronous failure report delay")
    service_window_s: float = Field(86400.0, gt=0)
    conversation_messages_per_minute: int = Field(200, ge=1)
    over_send_cap: Literal["reject", "fail"] = "reject"
    contact_search_per_minute: int = Field(100, ge=0, description="0 = unlimited; default from the profile")
    provider_id_after_s: float = Field(0.05, ge=0, description="platform/SMS: provider message id announced")
    # The regress rule's late ``sent``, this long after ``delivered``; unset: half of read_after_s.
    late_sent_after_s: float | None = Field(None, ge=0, description="regress: the late sent after delivered")
    random_seed: int = 20240601


class Webhooks(_Strict):
    header_prefix: str = "Chatwoot"  # this and the next two: default from the profile
    include_status: bool = False
    delay_s: float = Field(0.0, ge=0)
    duplicate_share: float = Field(0.0, ge=0, le=1)
    reorder_share: float = Field(0.0, ge=0, le=1)
    reorder_hold_s: float = Field(1.0, ge=0)
    drop_share: float = Field(0.0, ge=0, le=1)
    max_retries: int = Field(0, ge=0, le=20)
    retry_delay_s: float = Field(0.5, ge=0)
    timeout_s: float = Field(5.0, gt=0)
    concurrency: int = Field(2, ge=1, le=64)
    allowed_hosts: list[str] = ["127.0.0.1", "localhost", "::1"]


class Fault(_Strict):
    """Faults for one operationId; shares are drawn in this order: timeout, 429, 5xx, drop."""

    latency_s: float = Field(0.0, ge=0)
    timeout_share: float = Field(0.0, ge=0, le=1)
    timeout_s: float = Field(30.0, ge=0)
    timeout_then: Literal["close", "answer"] = "close"
    rate_limit_share: float = Field(0.0, ge=0, le=1)
    server_error_share: float = Field(0.0, ge=0, le=1)
    server_error_status: int = Field(503, ge=500, le=599)
    drop_response_share: float = Field(0.0, ge=0, le=1)
    drop_mode: Literal["close", "hang"] = "close"
    hang_s: float = Field(30.0, ge=0)


def validate_faults(raw: dict[str, Any]) -> dict[str, Fault]:
    """Parse a fault table; an operationId outside the contract is an error, not a silent no-op."""
    unknown = sorted(set(raw) - set(OPERATION_IDS))
    if unknown:
        raise ValueError(f"unknown operationId(s) in faults: {', '.join(unknown)}")
    return {op: Fault.model_validate(value) for op, value in raw.items()}


class SandboxConfig(_Strict):
    profile: ProfileName = DEFAULT_PROFILE
    accounts: list[Account]
    tokens: list[Token]
    inboxes: list[Inbox]
    contacts: list[Contact] = []
    recipient_rules: list[RecipientRule] = []
    behaviour: Behaviour = Behaviour()
    webhooks: Webhooks = Webhooks()
    faults: dict[str, Fault] = {}

    @model_validator(mode="before")
    @classmethod
    def _profile_defaults(cls, data: Any) -> Any:
        """Profile settings a file leaves out come from the chosen profile (sandbox/profiles.py)."""
        if not isinstance(data, dict):
            return data
        preset = PROFILES.get(data.get("profile", DEFAULT_PROFILE))
        if preset is None:
            return data  # an unknown name is refused by the field, naming it
        filled = dict(data)
        for table, key, field in PROFILE_SETTINGS:
            values = filled.get(table, {})
            if isinstance(values, dict) and key not in values:
                filled[table] = {**values, key: getattr(preset, field)}
        return filled

    @model_validator(mode="after")
    def _check_references(self) -> SandboxConfig:
        account_ids = {a.id for a in self.accounts}
        if len(account_ids) != len(self.accounts):
            raise ValueError("account ids must be unique")
        inbox_ids = [i.id for i in self.inboxes]
        if len(set(inbox_ids)) != len(inbox_ids):
            raise ValueError("inbox ids must be unique")
        for token in self.tokens:
            if not set(token.accounts) <= account_ids:
                raise ValueError("a token names an account that is not seeded")
        for inbox in self.inboxes:
            if inbox.account_id not in account_ids:
                raise ValueError(f"inbox {inbox.id} names an account that is not seeded")
        for contact in self.contacts:
            if contact.account_id not in account_ids:
                raise ValueError("a contact names an account that is not seeded")
        validate_faults({op: f.model_dump() for op, f in self.faults.items()})
        return self

    @property
    def dialect(self) -> Profile:
        """The shapes and rules of the chosen profile (see sandbox/profiles.py)."""
        return PROFILES[self.profile]


def _read_default_text() -> str:
    return resources.files("sandbox").joinpath("seed.default.toml").read_text(encoding="utf-8")


def merge_documents(
    default: dict[str, Any], override: dict[str, Any], *, profile: str | None = None
) -> dict[str, Any]:
    """Apply the merging rule in the module docstring to two parsed TOML documents.

    ``profile`` (the command line's ``--profile``) wins over the files' ``profile`` key. Profile
    settings the files leave out come from the chosen profile.
    """
    merged: dict[str, Any] = {}
    chosen = profile if profile is not None else override.get("profile", default.get("profile", DEFAULT_PROFILE))
    merged["profile"] = chosen  # the model fills the profile's settings and refuses an unknown name
    seed_source = override if "accounts" in override else default
    for key in SEED_KEYS:
        if key in seed_source:
            merged[key] = seed_source[key]
    for key in ("behaviour", "webhooks"):
        merged[key] = {**default.get(key, {}), **override.get(key, {})}
    faults: dict[str, Any] = {op: dict(v) for op, v in default.get("faults", {}).items()}
    for op, values in override.get("faults", {}).items():
        faults[op] = {**faults.get(op, {}), **values}
    merged["faults"] = faults
    extra = set(override) - set(SEED_KEYS) - {"behaviour", "webhooks", "faults", "profile"}
    for key in extra:
        merged[key] = override[key]  # rejected by the strict model with a clear message
    return merged


def load_config(path: str | Path | None = None, *, profile: str | None = None) -> SandboxConfig:
    """The default seed, overlaid with the file at ``path`` if given; ``profile`` wins over both."""
    default = tomllib.loads(_read_default_text())
    override = tomllib.loads(Path(path).read_text(encoding="utf-8")) if path else {}
    return SandboxConfig.model_validate(merge_documents(default, override, profile=profile))


def parse_config_text(text: str, *, profile: str | None = None) -> SandboxConfig:
    """Same as :func:`load_config` for TOML text (used by tests and the benchmark)."""
    default = tomllib.loads(_read_default_text())
    return SandboxConfig.model_validate(merge_documents(default, tomllib.loads(text), profile=profile))
