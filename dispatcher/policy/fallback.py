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

What follows a failure, whoever meets it (the send path, the consumer, the deadline sweep or the
repair of an owed decision), is :func:`choose`: a pure rule on the :class:`Failure` and what the
store says of the notification (:class:`Facts`). Its :class:`Choice` is recorded by one move
(:func:`dispatcher.tracking.outcomes.settle_failure`), so "at most one fallback" is decided here and
nowhere else (docs/lifecycle.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from dispatcher.lifecycle.states import AFTER_DECISION_PURPOSES

__all__ = ["OUTCOME_UNKNOWN", "Choice", "Facts", "Failure", "FallbackRules", "FallbackVerdict", "Next", "choose",
           "classify_failure", "parse_error_code", "resends_as_template", "send_failure_falls_back"]

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


EXTERNAL_ERROR = "external_error"  # the provider reported the message failed (its text is the detail)
PROVIDER_OPT_OUT = "opted_out"  # ... with a code that says the person opted out (recorded as a suppression)


@dataclass(frozen=True, slots=True)
class Failure:
    """Why the notification's current attempt needs what follows: the provider reported its message
    failed (``error_kind`` ``external_error``, ``detail`` the provider's text), the send path ended
    it before any message existed (``error_kind`` says why), or, ``late``, its message was not
    delivered by the route's deadline."""

    purpose: str  # the attempt's (dispatcher.lifecycle.states.AttemptPurpose)
    error_kind: str | None = None
    detail: str | None = None
    late: bool = False


@dataclass(frozen=True, slots=True)
class Facts:
    """What the store and the settings say of the notification, read by the one who records the choice."""

    fallback_route: str | None  # the notification's, as handed over
    fallback_configured: bool  # that route is in the settings
    route_configured: bool  # the notification's own route is in the settings (a template resend goes through it)
    has_template: bool  # its payload carries an approved template (read for a provider's failure only)
    provider_opt_out: bool = False  # the provider's code said the person opted out, and it was recorded


class Next(StrEnum):
    END = "end"  # a fallback's or a retry's failure: the notification ends failed, nothing more is sent
    RESEND_AS_TEMPLATE = "resend_as_template"  # 131047 on free text: the approved template, once, same route
    DECIDE = "decide"  # the single fallback decision: fall back, or not (ending failed unless ``late``)


@dataclass(frozen=True, slots=True)
class Choice:
    """What follows. For ``RESEND_AS_TEMPLATE``, ``fall_back`` and ``reason`` are the decision made
    instead when the resend is refused (a template attempt exists already)."""

    next: Next
    fall_back: bool
    reason: str
    error_kind: str | None
    detail: str | None


def choose(failure: Failure, facts: Facts, rules: FallbackRules) -> Choice:
    """What follows ``failure``: the one rule behind "at most one fallback"."""
    if failure.purpose in AFTER_DECISION_PURPOSES:  # the decision was made; this was its fallback (or a retry)
        kind = PROVIDER_OPT_OUT if facts.provider_opt_out else failure.error_kind or "internal"
        return Choice(Next.END, False, "fallback_failed", kind, failure.detail)
    if facts.provider_opt_out:
        return Choice(Next.DECIDE, False, "opted_out on the provider; no fallback", PROVIDER_OPT_OUT, failure.detail)
    if failure.late:
        fall_back, reason = True, "not delivered by the deadline"
    elif failure.error_kind == EXTERNAL_ERROR:
        verdict = classify_failure(failure.detail, rules, has_template=facts.has_template)
        fall_back, reason = verdict.fall_back, verdict.reason + (f" ({verdict.code})" if verdict.code else "")
        if resends_as_template(verdict, attempt_purpose=failure.purpose, has_template=facts.has_template) \
                and facts.route_configured:
            return Choice(Next.RESEND_AS_TEMPLATE, fall_back, reason, EXTERNAL_ERROR, failure.detail)
    else:
        kind = failure.error_kind or "internal"
        fall_back, reason = send_failure_falls_back(kind), f"send_failed ({kind})"
    if fall_back and facts.fallback_route is None:
        fall_back, reason = False, f"{reason}; no fallback route"
    elif fall_back and not facts.fallback_configured:
        fall_back, reason = False, f"{reason}; fallback route {facts.fallback_route!r} not configured"
    error_kind = None if failure.late else failure.error_kind or "internal"
    return Choice(Next.DECIDE, fall_back, reason, error_kind, failure.detail)
