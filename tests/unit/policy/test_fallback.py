"""classify_failure: which platform failures fall back, as a table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dispatcher.policy.fallback import (
    Choice,
    Facts,
    Failure,
    FallbackRules,
    FallbackVerdict,
    Next,
    choose,
    classify_failure,
    parse_error_code,
    resends_as_template,
)

DEFAULT = FallbackRules()

TABLE = [
    ("131026: Message undeliverable", True, "undeliverable", "131026"),
    ("(#131026) Message Undeliverable.", True, "undeliverable", "131026"),
    ("#131026 Message undeliverable", True, "undeliverable", "131026"),
    ("131047: Re-engagement message", False, "resend_as_template", "131047"),
    ("(#132000) Number of parameters does not match", False, "template_misconfigured", "132000"),
    ("132001: Template name does not exist in the translation", False, "template_misconfigured", "132001"),
    ("130429: Rate limit hit", False, "retry_later", "130429"),
    ("131000: Something went wrong", True, "unknown_code", "131000"),
    ("Message failed", True, "no_code", None),
    ("", True, "no_code", None),
    (None, True, "no_code", None),
    ("  (# 131026 ) spaced", True, "undeliverable", "131026"),
    ("1310260: seven digits is another code", True, "unknown_code", "1310260"),
]


@pytest.mark.parametrize(("text", "fall_back", "reason", "code"), TABLE)
def test_default_verdicts(text: str | None, fall_back: bool, reason: str, code: str | None) -> None:
    # given a failure text; when classified with the default rules; then the documented verdict
    assert classify_failure(text, DEFAULT) == FallbackVerdict(fall_back, reason, code)


def test_unknown_codes_follow_the_configured_default() -> None:
    # given rules that do not fall back on unknown codes
    rules = FallbackRules(unknown_falls_back=False)
    # when an unknown code or no code comes in; then no fallback
    assert classify_failure("131000: ?", rules) == FallbackVerdict(False, "unknown_code", "131000")
    assert classify_failure(None, rules) == FallbackVerdict(False, "no_code", None)
    # and known codes keep their verdicts
    assert classify_failure("131026: x", rules).fall_back is True


def test_codes_can_be_configured_either_way() -> None:
    # given rules that add a fallback code and move 131026 to no-fallback
    rules = FallbackRules(fallback_codes=frozenset({"131049"}),
                          no_fallback_codes=frozenset({"131026", "131047"}))
    # when classifying; then the configuration wins and the reason says so
    assert classify_failure("131049: x", rules) == FallbackVerdict(True, "configured_fallback", "131049")
    assert classify_failure("131026: x", rules) == FallbackVerdict(False, "configured_no_fallback", "131026")
    assert classify_failure("131047: x", rules) == FallbackVerdict(False, "resend_as_template", "131047")


@pytest.mark.parametrize("kwargs", [
    {"fallback_codes": frozenset({"131026"}), "no_fallback_codes": frozenset({"131026"})},
    {"fallback_codes": frozenset({"abc"})},
    {"no_fallback_codes": frozenset({"13 1"})},
])
def test_rules_refuse_contradictions_and_non_codes(kwargs: dict[str, frozenset[str]]) -> None:
    # given a code in both sets, or a code that is not digits; when building; then ValueError
    with pytest.raises(ValueError):
        FallbackRules(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "code"), [("+15550001111 is not on the platform", None),
                                            ("Error 131026", None), ("[131026] x", "131026")])
def test_only_a_leading_code_is_read(text: str, code: str | None) -> None:
    # given texts with a phone number or a code not at the start; then no code is invented
    assert parse_error_code(text) == code


def test_131047_resends_as_template_on_a_first_send_that_carries_one() -> None:
    verdict = classify_failure("131047: Re-engagement message", FallbackRules())
    assert (verdict.fall_back, verdict.reason) == (False, "resend_as_template")
    assert resends_as_template(verdict, attempt_purpose="first", has_template=True)
    assert not resends_as_template(verdict, attempt_purpose="template", has_template=True)  # once
    assert not resends_as_template(verdict, attempt_purpose="fallback", has_template=True)
    assert not resends_as_template(classify_failure("131026: x", FallbackRules()), attempt_purpose="first",
                                   has_template=True)


def test_131047_without_a_template_falls_back_since_nothing_else_can_go_out() -> None:
    verdict = classify_failure("131047: Re-engagement message", FallbackRules(), has_template=False)
    assert (verdict.fall_back, verdict.reason, verdict.code) == (True, "window_closed_no_template", "131047")
    assert not resends_as_template(verdict, attempt_purpose="first", has_template=False)


# --- choose: the one rule of what follows a failure (issue 46) -------------------------------------

FACTS = Facts(fallback_route="sms", fallback_configured=True, route_configured=True, has_template=True)


@pytest.mark.parametrize(("failure", "facts", "expected"), [
    # the provider reported the message undeliverable: the single fallback
    (Failure("first", "external_error", "131026: x"), FACTS,
     Choice(Next.DECIDE, True, "undeliverable (131026)", "external_error", "131026: x")),
    # ... but the notification has no fallback route, or one the settings no longer have
    (Failure("first", "external_error", "131026: x"), replace(FACTS, fallback_route=None),
     Choice(Next.DECIDE, False, "undeliverable (131026); no fallback route", "external_error", "131026: x")),
    (Failure("first", "external_error", "131026: x"), replace(FACTS, fallback_configured=False),
     Choice(Next.DECIDE, False, "undeliverable (131026); fallback route 'sms' not configured", "external_error",
            "131026: x")),
    # free text outside the window: the request's template, once, on the same route; refused, no fallback
    (Failure("first", "external_error", "131047: y"), FACTS,
     Choice(Next.RESEND_AS_TEMPLATE, False, "resend_as_template (131047)", "external_error", "131047: y")),
    (Failure("template", "external_error", "131047: y"), FACTS,
     Choice(Next.DECIDE, False, "resend_as_template (131047)", "external_error", "131047: y")),
    (Failure("first", "external_error", "131047: y"), replace(FACTS, route_configured=False),
     Choice(Next.DECIDE, False, "resend_as_template (131047)", "external_error", "131047: y")),
    # the person opted out on the provider: never another route
    (Failure("first", "external_error", "21610: z"), replace(FACTS, provider_opt_out=True),
     Choice(Next.DECIDE, False, "opted_out on the provider; no fallback", "opted_out", "21610: z")),
    # the send failed before a message existed: falls back unless another route would fail alike
    (Failure("first", "not_contactable", "no"), FACTS,
     Choice(Next.DECIDE, True, "send_failed (not_contactable)", "not_contactable", "no")),
    (Failure("first", "unreachable", None), FACTS, Choice(Next.DECIDE, False, "send_failed (unreachable)", "unreachable", None)),
    (Failure("first", None, None), FACTS, Choice(Next.DECIDE, False, "send_failed (internal)", "internal", None)),
    # not delivered by the deadline: fall back, the notification is not failed (no error kind)
    (Failure("first", late=True), FACTS, Choice(Next.DECIDE, True, "not delivered by the deadline", None, None)),
    (Failure("template", late=True), replace(FACTS, fallback_route=None),
     Choice(Next.DECIDE, False, "not delivered by the deadline; no fallback route", None, None)),
    # the fallback (or a host's retry) failed too: the end, never a second fallback
    (Failure("fallback", "external_error", "131026: x"), FACTS,
     Choice(Next.END, False, "fallback_failed", "external_error", "131026: x")),
    (Failure("fallback", "external_error", "21610: z"), replace(FACTS, provider_opt_out=True),
     Choice(Next.END, False, "fallback_failed", "opted_out", "21610: z")),
    (Failure("retry", "not_contactable", "no"), FACTS, Choice(Next.END, False, "fallback_failed", "not_contactable", "no")),
    (Failure("fallback", None, None), FACTS, Choice(Next.END, False, "fallback_failed", "internal", None)),
])
def test_what_follows_a_failure_is_chosen_by_one_rule(failure: Failure, facts: Facts, expected: Choice) -> None:
    assert choose(failure, facts, FallbackRules()) == expected


def test_no_failure_after_the_decision_ever_falls_back() -> None:
    """Whatever the failure and the facts, a fallback's or a retry's failure ends the notification."""
    for purpose in ("fallback", "retry"):
        for failure in (Failure(purpose, "external_error", "131026: x"), Failure(purpose, "not_contactable"),
                        Failure(purpose, late=True)):
            assert choose(failure, FACTS, FallbackRules()).next is Next.END
