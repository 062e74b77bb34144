"""Provider codes that mean "this person opted out", and what each one suppresses.

``21610`` (SMS: the number replied STOP to the provider) stops the channel it came on, for every
category; ``131050`` (business-messaging platform: the user stopped marketing messages) stops the
``marketing`` category on that channel. A failure with either is never retried and never falls back
to another channel: the person said no.
"""

from __future__ import annotations

from dispatcher.policy.fallback import parse_error_code
from dispatcher.settings import ChannelKind
from dispatcher.store.suppressions import ALL, Scope

MARKETING = "marketing"
OPT_OUT_CODES = frozenset({"21610", "131050"})


def means_opt_out(external_error: str | None) -> bool:
    return parse_error_code(external_error) in OPT_OUT_CODES


def opt_out_scope(external_error: str | None, *, channel: str) -> Scope | None:
    """The scope a failure's ``external_error`` opts its recipient out of, or None."""
    code = parse_error_code(external_error)
    if code == "21610":
        return Scope(channel=channel, category=ALL)
    if code == "131050":
        return Scope(channel=ChannelKind.MESSAGING_PLATFORM.value, category=MARKETING)
    return None
