"""The notification request a host hands over: its shape, checked at the edge.

Shape only: whether the route, the template and the channel rules fit the configuration is
checked by :mod:`dispatcher.intake.accept`, which knows the settings. Error messages name the field and
never repeat a value (a value may be a phone number or health data).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Annotated, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from dispatcher.errors import InvalidEvent
from dispatcher.queues import Priority
from dispatcher.recipients.contact import PLAIN
from dispatcher.recipients.contact import ContactDetails as ContactDetails  # part of the request, kept importable from here
from dispatcher.store.db import UNSTORABLE_TEXT

MAX_METADATA_KEYS = 20
INT64 = 2**63 - 1

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]*$")]
MetadataValue = Annotated[str, StringConstraints(max_length=200)] | int | float | bool  # checked further below


class TemplateChoice(BaseModel):
    """An approved template and its positional body parameters {"1": ..., "2": ...}."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    name: Annotated[str, StringConstraints(min_length=1, max_length=512), PLAIN]
    language: Annotated[str, StringConstraints(min_length=2, max_length=16), PLAIN]
    category: Literal["UTILITY", "MARKETING", "AUTHENTICATION"]
    params: dict[Annotated[str, StringConstraints(max_length=8), PLAIN],
                 Annotated[str, StringConstraints(max_length=1024), PLAIN]] = Field(default_factory=dict, repr=False)

    @model_validator(mode="after")
    def _positional(self) -> TemplateChoice:
        expected = [str(position) for position in range(1, len(self.params) + 1)]
        if sorted(self.params, key=lambda key: (len(key), key)) != expected:
            raise ValueError('params: keys are positions "1", "2", ... without gaps')
        return self


class NotificationRequest(BaseModel):
    """One business event to notify about; ``event_id`` is its idempotency key."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    event_id: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
    route: Name
    contact: ContactDetails
    content: Annotated[str, StringConstraints(min_length=1, max_length=4096), PLAIN] = Field(repr=False)
    template: TemplateChoice | None = None
    fallback_route: Name | None = None
    send_at: AwareDatetime | None = None
    # the workspace it goes through (docs/workspaces.md); absent: the default one
    workspace: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")] | None = None
    # what kind of notification this is, for opt-outs by category; the route's category when absent
    category: Name | None = None
    # its lane (docs/priorities.md): "urgent" goes first, through queues of its own; absent: the route's
    priority: Priority | None = None
    # the host's reference to the recipient's consent (web-session routes need one, or consent
    # recorded earlier); kept only as a keyed hash
    consent_ref: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200,
                                                  pattern=r"^[\x21-\x7e]+$")] | None = Field(default=None, repr=False)
    metadata: dict[Annotated[str, StringConstraints(min_length=1, max_length=64), PLAIN], MetadataValue] = Field(
        default_factory=dict, repr=False
    )

    @model_validator(mode="after")
    def _small_metadata(self) -> NotificationRequest:
        if len(self.metadata) > MAX_METADATA_KEYS:
            raise ValueError(f"metadata: at most {MAX_METADATA_KEYS} keys")
        for value in self.metadata.values():  # JSON allows 1e400 and huge integers; the stores do not
            if isinstance(value, str) and UNSTORABLE_TEXT.search(value):
                raise ValueError("metadata: must not hold a NUL character or an unpaired surrogate")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError("metadata: numbers must be finite")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64:
                raise ValueError("metadata: whole numbers must fit in 64 bits")
        if self.fallback_route is not None and self.fallback_route == self.route:
            raise ValueError("fallback_route: must differ from route")
        return self

    def fingerprint(self) -> str:
        """sha256 of the canonical request: the same event handed over again must match it."""
        dumped = self.model_dump(mode="json")
        if dumped["contact"]["time_zone"] is None:  # added later: absent, so that earlier requests keep their fingerprint
            del dumped["contact"]["time_zone"]
        for added_later in ("workspace", "priority"):  # the same
            if dumped[added_later] is None:
                del dumped[added_later]
        canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


class SendPayload(BaseModel):
    """What a send still needs of a request: stored beside the notification, as JSON, until no
    attempt can need it any more (then deleted), and read back by the send path as this record."""

    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    content: str = Field(repr=False)
    contact: ContactDetails
    template: TemplateChoice | None = None
    metadata: dict[str, MetadataValue] = Field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, request: NotificationRequest) -> SendPayload:
        return cls(content=request.content, contact=request.contact, template=request.template,
                   metadata=request.metadata)

    def stored(self) -> dict[str, object]:
        """The JSON column's value (contact fields that are absent are left out)."""
        return {
            "content": self.content,
            "contact": self.contact.model_dump(exclude_none=True),
            "template": None if self.template is None else self.template.model_dump(),
            "metadata": self.metadata,
        }


def parse_request(data: object) -> NotificationRequest:
    """Validate raw input (a dict, or JSON text/bytes) into a request, or raise InvalidEvent naming the field."""
    try:
        if isinstance(data, str | bytes):
            return NotificationRequest.model_validate_json(data)
        if isinstance(data, NotificationRequest):
            return data
        return NotificationRequest.model_validate(data)
    except ValidationError as error:
        raise _invalid_event(error) from None


def _invalid_event(error: ValidationError) -> InvalidEvent:
    problem = error.errors(include_input=False, include_url=False)[0]
    location = _named_by_schema(problem["loc"])
    message = str(problem["msg"]).removeprefix("Value error, ")
    if problem["type"] == "missing":
        message = "is required"
    field, _, rest = message.partition(": ")
    if rest and " " not in field:  # a model-level check names its own field first
        location.append(field)
        message = rest
    if problem["type"] == "json_invalid":
        return InvalidEvent("body", "is not valid JSON")
    return InvalidEvent(".".join(location) or "body", message)


# A key the host chose that reads as a field name ("colour", "fax", "nested", "appointment_id": lower
# case, at most four digits in all), or a template parameter's position ("1"): shown, so a typo can
# be found. Anything else (a capital, five digits, "+", "@", spaces: a name, a phone number, an
# address, a piece of content) is not.
_NAME_LIKE_KEY = re.compile(r"^(?:(?!(?:.*\d){5})[a-z][a-z0-9_-]{0,31}|\d{1,2})$")


def _named_by_schema(location: tuple[int | str, ...]) -> list[str]:
    """The error's place as the request's own schema names it. A key the host chose (an unknown
    field, a template parameter's or a metadata key's name) may be a phone number or a piece of
    content: unless it reads as a name, it is named ``*`` (list positions are kept)."""
    names = {*NotificationRequest.model_fields, *ContactDetails.model_fields, *TemplateChoice.model_fields, "[key]"}
    return [str(part) if isinstance(part, int) or part in names or _NAME_LIKE_KEY.match(part) else "*"
            for part in location]
