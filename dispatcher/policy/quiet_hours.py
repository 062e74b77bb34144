"""Send windows ("quiet hours"): a route may send only between two times of day, in the
recipient's time zone or, lacking one, the route's (else the configured default). Pure.

A notification due outside its route's window waits for the window's next opening: it is stored
``scheduled`` for that instant, so the sweep releases it then, like any scheduled notification,
and its send deadline counts from then. An attempt about to start outside its route's window (a
fallback decided at night, a host's retry, a run delayed past the close) waits for the opening
too (dispatcher.sending.send). A window may wrap midnight ("20:00-08:00" sends at night).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from dispatcher.settings import Route, Routing
from dispatcher.settings.windows import SendWindow, zone


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


def within_window(due: datetime | None, time_zone: str | None, route: Route, routing: Routing, *,
                  now: datetime) -> datetime | None:
    """``due`` (None: now) moved to the next opening of ``route``'s send window when it falls
    outside it; the zone is the recipient's (``time_zone``), else the route's, else the default."""
    if route.send_window is None:
        return due
    where = zone(time_zone or route.time_zone or routing.default_time_zone)
    opening = next_opening(due or now, SendWindow.parse(route.send_window), where)
    return due if opening == (due or now) else opening
