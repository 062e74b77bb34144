"""A route's send window and a time zone, as configuration and requests give them: checked where
they are read. What a window means for a send is policy (dispatcher.policy.quiet_hours)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import time
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator

WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


@dataclass(frozen=True)
class SendWindow:
    opens: time
    closes: time

    @classmethod
    def parse(cls, text: str) -> SendWindow:
        """``"08:00-20:00"``; ValueError (naming the form, not the value) for anything else."""
        match = WINDOW.match(text)
        if match is None:
            raise ValueError("a send window is HH:MM-HH:MM, for example 08:00-20:00")
        opens = time(int(match[1]), int(match[2]))
        closes = time(int(match[3]), int(match[4]))
        if opens == closes:
            raise ValueError("a send window opens and closes at different times")
        return cls(opens, closes)

    def contains(self, moment: time) -> bool:
        if self.opens < self.closes:
            return self.opens <= moment < self.closes
        return moment >= self.opens or moment < self.closes  # wraps midnight


def zone(name: str) -> ZoneInfo:
    """An IANA time zone; ValueError (without the value) when there is no such zone."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError("is not an IANA time zone, such as Europe/Berlin") from None


def checked_zone(name: str) -> str:
    """``name`` when it is an IANA time zone (a pydantic validator: settings and requests take zones)."""
    zone(name)
    return name


# A time zone's name, checked where it is read (a setting, a request's contact).
ZoneName = Annotated[str, AfterValidator(checked_zone)]
