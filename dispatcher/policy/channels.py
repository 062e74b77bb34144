"""Template or free text: the channel rules of the contract (rules 2-5), as pure functions.

* The business-messaging platform (:attr:`ChannelKind.MESSAGING_PLATFORM`) takes free text only
  inside the 24-hour customer-service window, which each incoming customer message opens;
  outside it, only an approved template (else the platform fails the message with 131047).
  A route with ``template_required`` always sends the template there.
* Every other channel (web session, SMS, e-mail, API inboxes, customer rooms) sends free text
  and never gets ``template_params``: the contract defines them for approved platform templates
  only. ``template_required`` has no effect off the platform; settings should refuse that pair.
* When a template is needed and the notification has none: :class:`InvalidEvent` on
  ``template``. Intake checks this first; the send path checks again because the window may
  have closed since.

When in doubt about the window, pass ``window_open=False``: a template outside the window is
always accepted, free text is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from dispatcher.errors import InvalidEvent
from dispatcher.settings import ChannelKind

__all__ = ["CHANNELS_REPORTING_READ", "MessageKind", "TemplateRef", "choose_message_kind", "reports_read",
           "template_params"]


# Which channels ever report ``read``. SMS carriers and mail servers know nothing of a read, and
# the web-session connection reports none either: there ``delivered`` is the last status a message
# gets, so it ends the read-backs (dispatcher.policy.readback). API inboxes and customer rooms
# (``other``) may report one: taken as reporting, so that a read is not missed.
CHANNELS_REPORTING_READ = frozenset({ChannelKind.MESSAGING_PLATFORM, ChannelKind.OTHER})


def reports_read(channel: str) -> bool:
    """Whether a message on ``channel`` (a :class:`ChannelKind` value) may still be read once
    delivered. An unknown name is taken as reporting: a read-back too many costs less than a read missed."""
    try:
        return ChannelKind(channel) in CHANNELS_REPORTING_READ
    except ValueError:
        return True


class MessageKind(StrEnum):
    TEMPLATE = "template"  # createMessage with template_params
    FREE_TEXT = "free_text"  # createMessage with content only


class TemplateRef(Protocol):
    """What a template needs to name itself (settings.Template or the request's template)."""

    @property
    def name(self) -> str: ...

    @property
    def language(self) -> str: ...

    @property
    def category(self) -> str: ...


def choose_message_kind(*, channel: ChannelKind, template_required: bool, window_open: bool,
                        has_template: bool) -> MessageKind:
    """What to send on ``channel`` (rules in the module docstring)."""
    if channel is not ChannelKind.MESSAGING_PLATFORM:
        return MessageKind.FREE_TEXT
    if not template_required and window_open:
        return MessageKind.FREE_TEXT
    if not has_template:
        why = "the route requires a template" if template_required else (
            "outside the 24-hour customer-service window the platform needs an approved template")
        raise InvalidEvent("template", f"missing: {why}")
    return MessageKind.TEMPLATE


def template_params(template: TemplateRef, body: Mapping[str, str]) -> dict[str, Any]:
    """The contract's ``template_params`` for createMessage.

    ``body`` maps positional keys "1", "2", ... to strings; the keys must run from "1" without a
    gap and, when ``template`` says how many it takes (``body_params``), match that count.
    With no body parameters ``processed_params`` is ``{}``. Errors name the field, never a value.
    """
    positions = sorted(_position(key) for key in body)
    if positions != list(range(1, len(positions) + 1)):
        raise InvalidEvent("template.body", 'keys must be "1", "2", ... without gaps')
    expected = getattr(template, "body_params", None)
    if isinstance(expected, int) and expected != len(positions):
        raise InvalidEvent("template.body",
                           f"template {template.name!r} takes {expected} parameters, got {len(positions)}")
    if any(not isinstance(value, str) for value in body.values()):
        raise InvalidEvent("template.body", "every parameter value must be a string")
    processed: dict[str, Any] = {"body": {str(n): body[str(n)] for n in positions}} if positions else {}
    return {"name": template.name, "category": str(template.category),
            "language": template.language, "processed_params": processed}


def _position(key: str) -> int:
    if not (isinstance(key, str) and key.isdigit() and key == str(int(key))):
        raise InvalidEvent("template.body", 'keys must be "1", "2", ... without gaps')
    return int(key)


SERVICE_WINDOW = timedelta(hours=24)  # opened by each incoming customer message (field notes)


def window_open(last_incoming_at: datetime | None, *, now: datetime) -> bool:
    """Whether the customer-service window is open: the contact wrote in less than 24 hours ago."""
    return last_incoming_at is not None and now - last_incoming_at < SERVICE_WINDOW
