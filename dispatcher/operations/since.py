"""A "since" an operator types, for the CLI's ``list --since`` and the dashboard's filter."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_HOURS_BACK = re.compile(r"^(\d{1,6})h$")
PROBLEM = "an ISO time such as 2026-11-26T08:00 (UTC unless it has an offset), or hours back such as 24h"


def parse_since(text: str, *, now: datetime) -> datetime:
    """The moment ``text`` names; ValueError (saying what is expected, not what was given) otherwise."""
    value = text.strip()
    hours = _HOURS_BACK.match(value)
    try:
        if hours:
            return now - timedelta(hours=int(hours[1]))
        moment = datetime.fromisoformat(value)
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValueError(PROBLEM) from None
