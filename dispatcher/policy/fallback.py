"""Whether a failed platform message falls back to the route's fallback: the classification
behind the single fallback decision (the tracking code makes it, once per notification).

The failure text is ``external_error`` of a failed message, e.g. ``"131026: Message
undeliverable"`` or ``"(#131026) Message Undeliverable."``; only its leading numeric code is
read. Verdicts (``reason`` is a stable short code):

========  =====================  ==========  ================================================
code      reason                 fall back   why / what the caller does instead
========  =====================  ==========  ================================================
131026    undeliverable          yes         the recipient cannot get it on this channel
131047    resend_as_template     no          window closed: resend on the SAME route as the
                                             approved template (:func:`resends_as_template`),
                                             never as free text; without a template in the
                                             request: ``window_closed_no_template``, fall back
132000    template_misconfigured no          parameter count differs from the approved
132001    template_misconfigured no          template / no such language: fix configuration
                                             and alert; the same content must not go out
                                             elsewhere
130429    retry_later            no          throughput limit: resend on the same route later
other     unknown_code           default     ``unknown_falls_back`` (True by default: the
                                             message is known to have failed, one fallback is
                                             bounded, and a reminder that reaches nobody is
                                             the worse outcome)
none      no_code                default     no text, or no leading code: same default
========  =====================  ==========  ================================================

Configured codes outside this table give ``configured_fallback`` / ``configured_no_fallback``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["OUTCOME_UNKNOWN", "FallbackRules", "FallbackVerdict", "classify_failure", "parse_error_code", "resends_as_template",
           "send_failure_falls_back"]

# code -> (reason, falls back by default). A rule set that moves a code to the other side gets
# a configured_* reason, so a reason never contradicts its verdict.
_KNOWN: dict[str, tuple[str, bool]] = {
    "131026": ("undeliverable", True),
    "131047": ("resend_as_template", False),
    "132000": ("template_misconfigured", False),
    "132001": ("template_misconfigured", False),
    "130429": ("retry_later", False),
}
# A leading code: "131026: ...", "(#131026) ...", "#131026 ...", "[131026] ...".
_CODE = re.compile(r"^\s*[(\[]?\s*#?\s*(\d{1,9})(?!\d)")


@dataclass(frozen=True, slots=True)
class FallbackRules:
    """Which ``external_error`` codes fall back. A code may sit in one set only."""

    fallback_codes: frozenset[str] = field(default_factory=lambda: frozenset({"131026"}))
    no_fallback_codes: frozenset[str] = field(
        default_factory=lambda: frozenset({"131047", "132000", "132001", "130429"}))
    unknown_falls_back: bool = True

    def __post_init__(self) -> None:
        both = self.fallback_codes & self.no_fallback_codes
        if both:
            raise ValueError(f"codes both fall back and do not: {sorted(both)}")
        for code in self.fallback_codes | self.no_fallback_codes:
            if not code.isascii() or not code.isdigit():
                raise ValueError(f"a code is digits only: {code!r}")


@dataclass(frozen=True, slots=True)
class FallbackVerdict:
    fall_back: bool
    reason: str  # stable short code, see the module docstring
    code: str | None  # the platform's numeric code, when the text starts with one


def parse_error_code(external_error: str | None) -> str | None:
    """The leading numeric code of a failure text, or None."""
    if not external_error:
        return None
    match = _CODE.match(external_error)
    return match.group(1) if match else None


_CODE_ENDS = re.compile(r"^(?:[:)\]]|\s+(?:-\s+)?[A-Za-z]|\s*$)")


def code_prefix(external_error: str) -> str:
    """The part of a failure text that holds its leading code, when it reads as one (followed by
    ":", ")", "]", a word or nothing): "" otherwise, as for "555 010 9999 ..." (a number, not a code)."""
    match = _CODE.match(external_error)
    if match is None or not _CODE_ENDS.match(external_error[match.end():]):
        return ""
    return external_error[:match.end()]


def classify_failure(external_error: str | None, rules: FallbackRules, *, has_template: bool = True) -> FallbackVerdict:
    """The verdict for one failed message (table in the module docstring). ``has_template``: the
    request carries an approved template (131047 without one falls back: nothing else can go out)."""
    code = parse_error_code(external_error)
    if code == "131047" and not has_template:
        return FallbackVerdict(True, "window_closed_no_template", code)
    if code is None:
        return FallbackVerdict(rules.unknown_falls_back, "no_code", None)
    for codes, fall_back in ((rules.fallback_codes, True), (rules.no_fallback_codes, False)):
        if code in codes:
            reason, usual = _KNOWN.get(code, ("", not fall_back))
            if usual != fall_back:
                reason = "configured_fallback" if fall_back else "configured_no_fallback"
            return FallbackVerdict(fall_back, reason, code)
    return FallbackVerdict(rules.unknown_falls_back, "unknown_code", code)


def resends_as_template(verdict: FallbackVerdict, *, attempt_purpose: str, has_template: bool) -> bool:
    """131047 (free text outside the customer-service window) on the first send of a request that
    carries an approved template: send that template once, on the same route, as a new attempt,
    before any fallback decision. A template attempt that fails is decided like any failure."""
    return verdict.code == "131047" and attempt_purpose == "first" and has_template


# A send that failed before any message existed falls back, except where another route would fail
# the same way (the whole workspace refused us, or could not be reached) or a person must act first.
# ``outcome_unknown``: an earlier try may have sent the message, and no read could tell; another
# route would risk a second message.
OUTCOME_UNKNOWN = "outcome_unknown"
# ``window_past_deadline``: the route's send window opens only after the notification's send
# deadline; the deadline is the notification's, so no route may send it any more.
WINDOW_PAST_DEADLINE = "window_past_deadline"
# ``send_deadline``: a wait without a call (our limiter) outlasted the send deadline; the same: the
# deadline is the notification's.
SEND_DEADLINE = "send_deadline"
_SEND_FAILURES_WITHOUT_FALLBACK = frozenset({"access_denied", "auth", "unreachable", "unavailable", "payload_missing",
                                             "payload_unreadable", "internal", OUTCOME_UNKNOWN, WINDOW_PAST_DEADLINE,
                                             SEND_DEADLINE})


def send_failure_falls_back(error_kind: str) -> bool:
    """Whether an attempt that ended before any message existed (``error_kind``) falls back."""
    return error_kind not in _SEND_FAILURES_WITHOUT_FALLBACK
