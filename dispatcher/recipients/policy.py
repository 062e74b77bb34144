"""Which routes need a recipient's consent before anything is sent."""

from __future__ import annotations

from dispatcher.settings import ChannelKind, Route, Routing


def needs_consent(route: Route, routing: Routing) -> bool:
    """The web-session channel is for "low-volume, expected and consented" sends (contract rule 4)."""
    return route.channel is ChannelKind.WEB_SESSION and routing.web_session_consent_required
