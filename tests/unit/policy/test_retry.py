"""decide: every error class to a Decision, tries exhaustion, Retry-After, and is_final."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.errors import (
    AccessDenied,
    ApiError,
    ApiStatusError,
    Forbidden,
    NotFound,
    NotSent,
    OutcomeUnknown,
    RateLimited,
    Rejected,
    ServerError,
    Unauthorized,
    UnexpectedResponse,
)
from dispatcher.errors import StateConflict
from dispatcher.policy.retry import Decision, DecisionKind, RetryPlan, classify_error, decide, is_final

PLAN = RetryPlan(max_tries=5, base_s=2.0, cap_s=60.0, max_countdown_s=120.0)
OP = "createMessage"
RETRY, CHECK, GIVE_UP = DecisionKind.RETRY, DecisionKind.CHECK_THEN_RETRY, DecisionKind.GIVE_UP

# error, expected kind, error_kind, resend_allowed (on the first try)
TABLE: list[tuple[BaseException, DecisionKind, str, bool]] = [
    (NotSent(OP, detail="PoolTimeout"), RETRY, "not_sent", True),
    (NotSent("listMessages", detail="ReadTimeout"), RETRY, "not_sent", True),
    (OutcomeUnknown(OP, detail="ReadTimeout"), CHECK, "outcome_unknown", True),
    (ServerError("listInboxes", status_code=500), RETRY, "server_error", True),
    (ServerError(OP, status_code=502, ambiguous=True), CHECK, "server_error", True),
    (RateLimited(OP), RETRY, "rate_limited", True),
    (RateLimited(OP, retry_after_s=5.0), RETRY, "rate_limited", True),
    (NotFound(OP, status_code=404), GIVE_UP, "not_found", False),
    (Rejected(OP, status_code=400), GIVE_UP, "rejected", False),
    (Rejected(OP, status_code=422), GIVE_UP, "rejected", False),
    (ApiStatusError(OP, status_code=409), GIVE_UP, "unexpected_status", False),
    (UnexpectedResponse("listMessages"), GIVE_UP, "unexpected_response", False),
    (UnexpectedResponse(OP, ambiguous=True), CHECK, "unexpected_response", False),
    (ApiError(OP), GIVE_UP, "api_error", False),
    (RuntimeError("boom"), GIVE_UP, "internal", False),
    (StateConflict("lost the race"), GIVE_UP, "internal", False),
]


@pytest.mark.parametrize(("error", "error_kind"), [
    (Unauthorized(OP, status_code=401), "auth"),
    (Forbidden(OP, status_code=403), "auth"),
    (AccessDenied(OP, status_code=403), "auth"),
    (NotSent(OP, detail="ConnectError"), "unreachable"),
    (NotSent("listInboxes", detail="ConnectTimeout"), "unreachable"),
])
def test_a_refused_token_or_no_connection_pauses_the_workspace(error: BaseException, error_kind: str) -> None:
    # at any try: the breaker waits for the workspace, the try is not the notification's fault
    for tries in (1, PLAN.max_tries + 5):
        decision = decide(error, tries=tries, plan=PLAN, rng=random.Random(1))
        assert (decision.kind, decision.error_kind, decision.resend_allowed) == (DecisionKind.PAUSE_WORKSPACE, error_kind, False)
        assert "check DISPATCHER_" in decision.reason


@pytest.mark.parametrize(("error", "kind", "error_kind", "resend_allowed"), TABLE,
                         ids=[f"{type(row[0]).__name__}-{row[2]}-{row[1]}" for row in TABLE])
def test_each_error_class_maps_to_its_decision(error: BaseException, kind: DecisionKind,
                                               error_kind: str, resend_allowed: bool) -> None:
    # given the first try failed with this error
    # when deciding
    decision = decide(error, tries=1, plan=PLAN, rng=random.Random(1))
    # then the decision has the expected kind, code and resend permission
    assert (decision.kind, decision.error_kind, decision.resend_allowed) == (kind, error_kind, resend_allowed)
    assert classify_error(error) == error_kind
    if kind is GIVE_UP:
        assert decision.delay_s == 0.0
    else:
        assert 0 < decision.delay_s <= PLAN.cap_s or isinstance(error, RateLimited)


@pytest.mark.parametrize("error", [row[0] for row in TABLE if row[1] is GIVE_UP])
def test_final_errors_are_never_retried_at_any_try(error: BaseException) -> None:
    # given a final error; when it comes back on any try; then the answer is always give_up
    for tries in range(1, PLAN.max_tries + 2):
        assert decide(error, tries=tries, plan=PLAN, rng=random.Random(tries)).kind is GIVE_UP
    assert is_final(error)


@pytest.mark.parametrize("error", [NotSent(OP), ServerError("listInboxes", status_code=503),
                                   RateLimited(OP), RateLimited(OP, retry_after_s=3.0)])
def test_retryable_errors_give_up_when_tries_are_used(error: ApiError) -> None:
    # given a plan of 5 tries
    # when the 4th try fails, then the 5th
    before = decide(error, tries=4, plan=PLAN, rng=random.Random(0))
    at_limit = decide(error, tries=5, plan=PLAN, rng=random.Random(0))
    # then the 4th still retries and the 5th gives up as tries_exhausted
    assert before.kind is RETRY
    assert (at_limit.kind, at_limit.error_kind, at_limit.resend_allowed) == (GIVE_UP, "tries_exhausted", False)
    assert not is_final(error)


@pytest.mark.parametrize("error", [OutcomeUnknown(OP), ServerError(OP, status_code=504, ambiguous=True)])
def test_ambiguous_write_at_the_limit_still_looks_first(error: ApiError) -> None:
    # given a write whose outcome is unknown fails on the last allowed try (and beyond)
    for tries in (PLAN.max_tries, PLAN.max_tries + 3):
        # when deciding
        decision = decide(error, tries=tries, plan=PLAN, rng=random.Random(0))
        # then it never gives up blind: look first, and do not resend if nothing is found
        assert decision.kind is CHECK
        assert decision.error_kind == "tries_exhausted"
        assert decision.resend_allowed is False
        assert decision.delay_s > 0


@given(retry_after_s=st.floats(min_value=0.0, max_value=100_000.0), seed=st.integers(),
       tries=st.integers(min_value=1, max_value=4))
def test_retry_after_is_honoured_never_shortened(retry_after_s: float, seed: int, tries: int) -> None:
    # given a 429 carrying Retry-After
    error = RateLimited(OP, retry_after_s=retry_after_s)
    # when deciding
    decision = decide(error, tries=tries, plan=PLAN, rng=random.Random(seed))
    # then the wait is at least Retry-After plus a little jitter, and every worker pauses that long
    assert retry_after_s <= decision.delay_s <= retry_after_s + max(1.0, retry_after_s * 0.1)
    assert decision.pause_s == decision.delay_s
    assert decision.deferred is (decision.delay_s > PLAN.max_countdown_s)


def test_retry_after_jitter_differs_between_workers() -> None:
    # given ten workers getting the same Retry-After
    error = RateLimited(OP, retry_after_s=30.0)
    # when each decides with its own random source
    delays = {decide(error, tries=1, plan=PLAN, rng=random.Random(seed)).delay_s for seed in range(10)}
    # then they do not all come back at the same instant
    assert len(delays) > 1 and min(delays) >= 30.0


def test_429_without_retry_after_backs_off_and_pauses_everyone() -> None:
    # given a 429 without Retry-After (what the service really sends)
    error = RateLimited(OP)
    # when it happens on successive tries
    first = decide(error, tries=1, plan=PLAN, rng=random.Random(3))
    third = decide(error, tries=3, plan=PLAN, rng=random.Random(3))
    # then the delay is the capped backoff, growing with the tries, and the pause equals it
    assert 1.0 <= first.delay_s <= 2.0 and 4.0 <= third.delay_s <= 8.0
    assert first.pause_s == first.delay_s > 0


def test_a_503_with_retry_after_waits_that_long_without_pausing_everyone() -> None:
    # given a 503 with Retry-After on a read
    error = ServerError("listInboxes", status_code=503, retry_after_s=20.0)
    # when deciding
    decision = decide(error, tries=1, plan=PLAN, rng=random.Random(0))
    # then it retries no sooner, and only a 429 pauses the shared limiter
    assert decision.kind is RETRY and decision.delay_s >= 20.0 and decision.pause_s == 0.0


def test_long_waits_become_due_times_not_countdowns() -> None:
    # given a Retry-After longer than the broker may hold a countdown
    error = RateLimited(OP, retry_after_s=3600.0)
    # when deciding
    decision = decide(error, tries=1, plan=PLAN, rng=random.Random(0))
    # then the decision says to store a due time
    assert decision.deferred is True and decision.delay_s >= 3600.0
    # and a short backoff stays a countdown
    assert decide(NotSent(OP), tries=1, plan=PLAN, rng=random.Random(0)).deferred is False


def test_reason_carries_no_body_or_context_values() -> None:
    # given an error holding our IDs and a detail
    error = ServerError(OP, status_code=502, ambiguous=True, context={"conversation_id": 9},
                        detail="ReadTimeout")
    # when deciding
    reason = decide(error, tries=1, plan=PLAN, rng=random.Random(0)).reason
    # then the reason names the code, operation and status only
    assert reason == "server_error (createMessage, HTTP 502)"


def test_internal_errors_name_the_class_only() -> None:
    # given a bug whose message may hold anything
    decision = decide(KeyError("+15550001111"), tries=1, plan=PLAN, rng=random.Random(0))
    # then give_up as internal, and the message text is not repeated
    assert decision == Decision(GIVE_UP, 0.0, "internal error KeyError", "internal", resend_allowed=False)


@pytest.mark.parametrize("kwargs", [{"max_tries": 0}, {"base_s": 0.0}, {"base_s": 10.0, "cap_s": 5.0},
                                    {"cap_s": float("inf")}, {"max_countdown_s": 0.0}])
def test_plan_refuses_nonsense(kwargs: dict[str, float]) -> None:
    # given an impossible plan; when building it; then ValueError
    with pytest.raises(ValueError):
        RetryPlan(**kwargs)  # type: ignore[arg-type]


def test_tries_counts_the_failed_try() -> None:
    # given tries=0 (nothing failed yet); when deciding; then the call is refused as a bug
    with pytest.raises(ValueError):
        decide(NotSent(OP), tries=0, plan=PLAN, rng=random.Random(0))
