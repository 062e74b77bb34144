"""Routes (a named way to reach a contact: an inbox, its channel, a fallback), the template
registry, and the rules that decide what a failure leads to."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dispatcher.queues import Priority
from dispatcher.settings.checks import CallbackUrl, Concern
from dispatcher.settings.windows import SendWindow, checked_zone

ROUTE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


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
        if value is not None:
            SendWindow.parse(value)
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        return checked_zone(value) if value is not None else None

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


def check_routes(routes: dict[str, Route], where: str) -> None:
    """Route names are plain, and each fallback names another route of the same set."""
    for name, route in routes.items():
        if not ROUTE_NAME.match(name):
            raise ValueError(f"{where}.{name}: a route name is lower-case letters, digits, _ . -")
        if route.fallback is not None:
            if route.fallback == name:
                raise ValueError(f"{where}.{name}.fallback: a route cannot fall back to itself")
            if route.fallback not in routes:
                raise ValueError(f"{where}.{name}.fallback: no route named {route.fallback!r}")


class Routing(Concern):
    routes: dict[str, Route] = Field(default_factory=dict)
    templates: list[Template] = Field(default_factory=list)
    # The time zone of a route's send window when neither the recipient nor the route names one.
    default_time_zone: str = "UTC"
    # What a failure leads to: external_error codes that fall back, those that do not, and
    # whether a failure with another code, or none, falls back.
    fallback_codes: list[str] = Field(default_factory=lambda: ["131026"])
    no_fallback_codes: list[str] = Field(default_factory=lambda: ["131047", "132000", "132001", "130429"])
    unknown_error_falls_back: bool = True
    # Web-session routes send only to recipients who consented (contract rule 4): a consent_ref in
    # the request, or consent recorded before. Off only where the host checks consent itself.
    web_session_consent_required: bool = True

    @field_validator("default_time_zone")
    @classmethod
    def _default_zone(cls, value: str) -> str:
        return checked_zone(value)

    @model_validator(mode="after")
    def _routes_and_templates_agree(self) -> Routing:
        check_routes(self.routes, "routes")
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

    def template(self, name: str, language: str) -> Template | None:
        """The registered template with that name and language, or None."""
        for template in self.templates:
            if template.name == name and template.language == language:
                return template
        return None
