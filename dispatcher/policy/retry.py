"""What to do after a failed API call: retry, look first, or give up. Pure.

Tasks only apply a :class:`Decision`: ``retry`` becomes ``self.retry(countdown=delay_s)`` (or a
due-time row when ``deferred``), ``check_then_retry`` means "read the conversation's messages
and adopt the message if it is there" before anything else, ``give_up`` a final state with
``error_kind`` recorded. Rules, in order:

0. The workspace refused our token (401/403) or could not be reached at all (no connection):
   ``pause_workspace`` with ``error_kind`` ``auth`` or ``unreachable`` and a plain-words
   ``reason``. The caller trips the shared circuit breaker (:mod:`dispatcher.policy.breaker`):
   every worker waits, the notification says why, and the try is not counted.
1. Not an :class:`~dispatcher.api.errors.ApiError` (a bug, a database error): ``give_up`` as
   ``internal``. Retrying our own bug only repeats it; the task's crash handling (late acks)
   still covers a process that died.
2. Final errors (``retryable`` is False: 401/403, 404, 400/422, unreadable body, statuses off the
   contract's table) are never retried. If the error is also ``ambiguous`` (an unreadable 2xx
   body for a write: the service accepted it), the decision is ``check_then_retry`` with
   ``resend_allowed=False``: look, adopt what is there, otherwise give up. Never resend.
3. ``tries >= plan.max_tries``: ``give_up`` as ``tries_exhausted``, except for an ambiguous error
   (OutcomeUnknown, a 5xx on a write): we never give up blind on a write that may have gone
   out, so it is ``check_then_retry`` with ``resend_allowed=False`` and ``error_kind``
   ``tries_exhausted`` (a mark on the attempt, which does not end it): the next run looks,
   adopts the message if it is there, else ends the attempt ``not_found_after_unknown_outcome``
   (the read then proves nothing was sent). The look is a read; it does not count as a try.
4. Retryable: ambiguous → ``check_then_retry``; otherwise ``retry``. The delay is
   ``Retry-After`` plus 0–10 % (at least 0–1 s) of jitter when the service sent one (never
   less), else :func:`~dispatcher.policy.backoff.backoff_s` of ``tries - 1``.
   A 429 also sets ``pause_s``: the caller pauses the shared limiter (every worker) that long.

``tries`` counts the tries made so far, the failed one included (>= 1): calls that reached the
workspace and failed, 429s included (the limiter is what keeps 429s rare). A run that made no
call, or died, is no try: crash loops have their own guard in the send path (``send_max_runs``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum

from dispatcher.api import errors as api_errors
from dispatcher.policy.backoff import backoff_s
from dispatcher.policy.breaker import pause_reason

__all__ = ["Decision", "DecisionKind", "RetryPlan", "classify_error", "decide", "is_final"]

_JITTER_SHARE = 0.10  # of a Retry-After value
_MIN_JITTER_S = 1.0

# Most specific first: the first matching class names the error.
_KINDS: tuple[tuple[type[Exception], str], ...] = (
    (api_errors.RateLimited, "rate_limited"),
    (api_errors.ServerError, "server_error"),
    (api_errors.AccessDenied, "access_denied"),
    (api_errors.NotFound, "not_found"),
    (api_errors.Rejected, "rejected"),
    (api_errors.ApiStatusError, "unexpected_status"),
    (api_errors.NotSent, "not_sent"),
    (api_errors.OutcomeUnknown, "outcome_unknown"),
    (api_errors.UnexpectedResponse, "unexpected_response"),
    (api_errors.ApiError, "api_error"),
)


class DecisionKind(StrEnum):
    """What the task does next; the values are stable (they may be stored and logged)."""

    RETRY = "retry"
    CHECK_THEN_RETRY = "check_then_retry"  # look for the message before any resend
    GIVE_UP = "give_up"
    PAUSE_WORKSPACE = "pause_workspace"  # stop calling the workspace, every worker; nothing was sent


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """How hard to try. Seconds throughout.

    ``max_tries`` counts every try, the first included. ``max_countdown_s`` is the longest wait
    handed to the broker as a countdown: Celery's Redis transport redelivers a delayed task that
    outlives its visibility timeout, so a longer wait must become a row with a due time.
    """

    max_tries: int = 6
    base_s: float = 2.0
    cap_s: float = 300.0
    max_countdown_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_tries < 1:
            raise ValueError("max_tries must be >= 1")
        if not (0 < self.base_s <= self.cap_s and math.isfinite(self.cap_s)):
            raise ValueError("need 0 < base_s <= cap_s, both finite")
        if not self.max_countdown_s > 0:
            raise ValueError("max_countdown_s must be > 0")


@dataclass(frozen=True, slots=True)
class Decision:
    """One verdict. ``reason`` is short and body-free (operation, status, codes only).

    ``resend_allowed`` matters for ``check_then_retry``: when False, a look that finds no message
    ends the notification (``give_up`` with ``error_kind``) instead of sending again.
    ``deferred``: ``delay_s`` exceeds the plan's ``max_countdown_s``; store a due time
    (now + ``delay_s``) instead of a broker countdown. ``pause_s`` > 0: pause every worker.
    """

    kind: DecisionKind
    delay_s: float
    reason: str
    error_kind: str
    resend_allowed: bool = True
    deferred: bool = False
    pause_s: float = 0.0


def classify_error(error: BaseException) -> str:
    """A stable short code for an error: ``rate_limited``, ``not_sent`` ... or ``internal``."""
    for cls, code in _KINDS:
        if isinstance(error, cls):
            return code
    return "internal"


def is_final(error: BaseException) -> bool:
    """True when no later try may send again (an ambiguous final error is still looked for)."""
    return not (isinstance(error, api_errors.ApiError) and error.retryable)


def decide(error: BaseException, *, tries: int, plan: RetryPlan, rng: random.Random) -> Decision:
    """The decision after try number ``tries`` failed with ``error`` (rules in the module doc)."""
    if tries < 1:
        raise ValueError("tries counts the failed try too: it is >= 1")
    paused = pause_reason(error)
    if paused is not None:
        return Decision(DecisionKind.PAUSE_WORKSPACE, 0.0, paused[1], paused[0], resend_allowed=False)
    code = classify_error(error)
    if not isinstance(error, api_errors.ApiError):
        return Decision(DecisionKind.GIVE_UP, 0.0, f"internal error {type(error).__name__}",
                        "internal", resend_allowed=False)
    where = _describe(error)
    if is_final(error):
        if error.ambiguous:
            return _look(plan, rng, tries, f"{code} {where}: may have been sent; look, never resend",
                         code)
        return Decision(DecisionKind.GIVE_UP, 0.0, f"{code} {where}: final", code,
                        resend_allowed=False)
    if tries >= plan.max_tries:
        if error.ambiguous:
            return _look(plan, rng, tries,
                         f"{code} {where} at try {tries}: look; give up if nothing was sent",
                         "tries_exhausted")
        return Decision(DecisionKind.GIVE_UP, 0.0, f"{code} {where}: {tries} tries used",
                        "tries_exhausted", resend_allowed=False)
    retry_after_s = getattr(error, "retry_after_s", None)
    if retry_after_s is not None:
        delay_s = retry_after_s + rng.uniform(0.0, max(_MIN_JITTER_S, retry_after_s * _JITTER_SHARE))
        where += f" Retry-After {retry_after_s:g}s"
    else:
        delay_s = backoff_s(tries - 1, base_s=plan.base_s, cap_s=plan.cap_s, rng=rng)
    kind = DecisionKind.CHECK_THEN_RETRY if error.ambiguous else DecisionKind.RETRY
    pause_s = delay_s if isinstance(error, api_errors.RateLimited) else 0.0
    return Decision(kind, delay_s, f"{code} {where}", code,
                    deferred=delay_s > plan.max_countdown_s, pause_s=pause_s)


def _look(plan: RetryPlan, rng: random.Random, tries: int, reason: str, code: str) -> Decision:
    """Look for the message after a short backoff, so a write in flight has time to land."""
    delay_s = backoff_s(tries - 1, base_s=plan.base_s, cap_s=plan.cap_s, rng=rng)
    return Decision(DecisionKind.CHECK_THEN_RETRY, delay_s, reason, code, resend_allowed=False,
                    deferred=delay_s > plan.max_countdown_s)


def _describe(error: api_errors.ApiError) -> str:
    status = getattr(error, "status_code", None)
    return f"({error.operation}" + (f", HTTP {status})" if status is not None else ")")
