"""Send windows ("quiet hours"): a route may send only between two times of day, in the
recipient's time zone or, lacking one, the route's (else the configured default). Pure.

A notification due outside its route's window waits for the window's next opening: it is stored
``scheduled`` for that instant, so the sweep releases it then, like any scheduled notification,
and its send deadline counts from then. An attempt about to start outside its route's window (a
fallback decided at night, a host's retry, a run delayed past the close) waits for the opening
too (dispatcher.sending.send). A window may wrap midnight ("20:00-08:00" sends at night).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import TYPE_CHECKING, Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator

if TYPE_CHECKING:  # the settings module imports this one (its validators check windows and zones)
    from dispatcher.settings import Route, Settings

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


def next_opening(due: datetime, window: SendWindow, where: ZoneInfo) -> datetime:
    """``due`` when it falls inside the window, else the window's next opening after it (in UTC).
    Local times that a clock change skips or repeats resolve as ``zoneinfo`` resolves them (fold 0)."""
    local = due.astimezone(where)
    if window.contains(local.time().replace(tzinfo=None)):
        return due
    opening = datetime.combine(local.date(), window.opens, tzinfo=where)
    if opening <= local:
        opening = datetime.combine(local.date() + timedelta(days=1), window.opens, tzinfo=where)
    return opening.astimezone(UTC)


def within_window(due: datetime | None, time_zone: str | None, route: Route, settings: Settings, *,
                  now: datetime) -> datetime | None:
    """``due`` (None: now) moved to the next opening of ``route``'s send window when it falls
    outside it; the zone is the recipient's (``time_zone``), else the route's, else the default."""
    if route.send_window is None:
        return due
    where = zone(time_zone or route.time_zone or settings.default_time_zone)
    opening = next_opening(due or now, SendWindow.parse(route.send_window), where)
    return due if opening == (due or now) else opening
