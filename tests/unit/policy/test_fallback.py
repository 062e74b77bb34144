"""classify_failure: which platform failures fall back, as a table."""

from __future__ import annotations

import pytest

from dispatcher.policy.fallback import FallbackRules, FallbackVerdict, classify_failure, parse_error_code, resends_as_template

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
