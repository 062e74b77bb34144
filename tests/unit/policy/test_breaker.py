"""The workspace circuit breaker: which errors trip it, backoff, one probe, closing. No servers."""

from __future__ import annotations

import random

import pytest

from dispatcher.api import errors as api_errors
from dispatcher.policy.breaker import PROBE_LEASE_S, BreakerPlan, LocalBreaker, Pause, Probe, pause_reason


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("error", "kind", "names"), [
    (api_errors.Unauthorized("listInboxes", status_code=401), "auth", "DISPATCHER_API_TOKEN"),
    (api_errors.Forbidden("searchContacts", status_code=403), "auth", "DISPATCHER_ACCOUNT_ID"),
    (api_errors.NotSent("createMessage", detail="ConnectError"), "unreachable", "DISPATCHER_API_URL"),
    (api_errors.NotSent("listMessages", detail="ConnectTimeout"), "unreachable", "DISPATCHER_API_URL"),
])
def test_a_refused_token_or_no_connection_trips_it_with_plain_words(error: Exception, kind: str, names: str) -> None:
    found = pause_reason(error)
    assert found is not None
    assert found[0] == kind and names in found[1]


@pytest.mark.parametrize("error", [
    api_errors.ServerError("createMessage", status_code=503),
    api_errors.RateLimited("searchContacts"),
    api_errors.NotFound("listMessages", status_code=404),
    api_errors.NotSent("listInboxes", detail="ReadTimeout"),  # it answered, slowly: not a pause for everyone
    api_errors.OutcomeUnknown("createMessage", detail="ReadTimeout"),
])
def test_other_errors_do_not(error: Exception) -> None:
    assert pause_reason(error) is None


def test_the_pause_doubles_up_to_its_cap_with_jitter_below() -> None:
    plan, rng = BreakerPlan(base_s=5, cap_s=60), random.Random(3)
    pauses = [plan.pause_s(trips, rng) for trips in range(1, 7)]
    assert 4.0 <= pauses[0] <= 5.0 and 8.0 <= pauses[1] <= 10.0
    assert all(48.0 <= pause <= 60.0 for pause in pauses[4:])


def test_closed_open_probe_then_closed_again() -> None:
    clock = Clock()
    breaker = LocalBreaker(BreakerPlan(base_s=10, cap_s=60), clock=clock, rng=random.Random(1))
    assert breaker.gate() is None
    pause, opened = breaker.trip("auth", "the workspace refused the API token")
    assert opened and isinstance(breaker.gate(), Pause)
    assert breaker.trip("auth", "again")[1] is False  # tripped while open: not opened anew
    clock.now = breaker.trip("auth", "again")[0].until + 0.1
    assert isinstance(breaker.gate(), Probe)  # exactly one caller probes ...
    second = breaker.gate()
    assert isinstance(second, Pause) and second.until <= clock.now + PROBE_LEASE_S  # ... the others wait
    assert breaker.close() is True and breaker.gate() is None
    assert breaker.close() is False


def test_a_failed_probe_waits_longer() -> None:
    clock = Clock()
    breaker = LocalBreaker(BreakerPlan(base_s=10, cap_s=1000), clock=clock, rng=random.Random(1))
    first, _ = breaker.trip("unreachable", "no connection")
    clock.now = first.until + 0.1
    assert isinstance(breaker.gate(), Probe)
    second, opened = breaker.trip("unreachable", "no connection")
    assert not opened and second.until - clock.now >= 16.0  # the second pause: 20 s, jitter at most -20 %


def test_five_notifications_answered_5xx_in_a_row_trip_it_as_unavailable_and_any_answer_ends_the_streak() -> None:
    clock = Clock()
    breaker = LocalBreaker(BreakerPlan(base_s=10, cap_s=60, trip_after_server_errors=5), clock=clock,
                           rng=random.Random(1))
    # one notification's calls failing again and again count once: its own tries end it
    assert [breaker.server_error(7) for _ in range(12)] == [None] * 12
    breaker.answered()  # (another notification's call was answered)
    # four notifications' 5xx, then an answer: the streak ends, the breaker stays closed
    assert [breaker.server_error(n) for n in range(4)] == [None] * 4
    breaker.answered()
    assert [breaker.server_error(n) for n in range(4)] == [None] * 4 and breaker.gate() is None
    # the fifth notification in a row trips it: every run now waits, saying why in plain words
    tripped = breaker.server_error(4)
    assert tripped is not None and tripped[1] is True
    gate = breaker.gate()
    assert isinstance(gate, Pause) and gate.reason == "unavailable" and "5xx" in gate.detail
    # after the pause one run probes; its success closes it and starts a new count
    clock.now += 60
    assert isinstance(breaker.gate(), Probe)
    assert breaker.close() is True
    assert [breaker.server_error(n) for n in range(4)] == [None] * 4
