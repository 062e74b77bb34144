"""Who receives a notification, as a host names them: the contact's details and the checks of its
addresses. The intake's request carries them (:mod:`dispatcher.intake.request`); the recipients'
controls check the same addresses and key them (:mod:`dispatcher.recipients.keys`). Messages name
the field and never repeat a value.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from dispatcher.settings.windows import ZoneName
from dispatcher.store.db import UNSTORABLE_TEXT  # refused here, so no insert fails later

E164 = re.compile(r"^\+[1-9]\d{6,14}$")
EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,255}\.[^@\s]{2,63}$")
EMAIL_MAX_CHARS = 254  # RFC 5321's longest address; the workspace keeps e-mail in a 255-character column


def _plain_text(value: str) -> str:
    if UNSTORABLE_TEXT.search(value):
        raise ValueError("must not hold a NUL character or an unpaired surrogate")
    return value


PLAIN = AfterValidator(_plain_text)


def check_addresses(phone_number: str | None, email: str | None) -> None:
    """A phone number in E.164 form and an e-mail address that looks like one (messages name the
    field, never the value)."""
    if phone_number is not None and not E164.match(phone_number):
        raise ValueError("phone_number: must be in E.164 form, such as +15551234567")
    if email is not None and not EMAIL.match(email):
        raise ValueError("email: is not an e-mail address")


class ContactDetails(BaseModel):
    """Who receives it. The identifier is the host's stable contact ID; a phone is E.164."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    identifier: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200), PLAIN] | None = None
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200), PLAIN] | None = Field(
        default=None, repr=False
    )
    phone_number: str | None = Field(default=None, repr=False)
    email: Annotated[str, StringConstraints(max_length=EMAIL_MAX_CHARS), PLAIN] | None = Field(default=None, repr=False)
    time_zone: ZoneName | None = None  # IANA; a route's send window is read in it (docs/notifications.md)

    @model_validator(mode="after")
    def _reachable(self) -> ContactDetails:
        check_addresses(self.phone_number, self.email)
        if self.identifier is None and self.phone_number is None:
            raise ValueError("identifier: give at least an identifier or a phone_number")
        return self
