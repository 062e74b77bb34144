"""Which replies opt out or in, and which provider codes mean an opt-out (pure functions)."""

from __future__ import annotations

import pytest

from dispatcher.recipients.keywords import keyword_of, reply_intent, vocabulary
from dispatcher.recipients.platform import opt_out_scope
from dispatcher.settings import Route

SMS = Route(inbox_id=2, channel="sms")
WORDS = vocabulary([SMS])


@pytest.mark.parametrize(("text", "intent"), [
    ("STOP", "opt_out"), ("  stop\n", "opt_out"), ("Stopp", "opt_out"), ("abmelden", "opt_out"),
    ("UNSUBSCRIBE", "opt_out"), ("start", "opt_in"), ("Anmelden", "opt_in"), ("YES", "opt_in"),
    ("Please don't stop the reminders", None), ("stop please", None), ("", None), ("STOP STOP", None),
])
def test_only_a_whole_keyword_reply_counts(text: str, intent: str | None) -> None:
    assert reply_intent(keyword_of(text, WORDS), SMS) == intent


def test_anything_but_a_short_string_is_no_keyword() -> None:
    for value in (None, 7, ["STOP"], {"text": "STOP"}, "STOP" + " " * 300):
        assert keyword_of(value, WORDS) is None


def test_a_route_s_own_lists_decide() -> None:
    custom = Route(inbox_id=2, channel="sms", opt_out_keywords=["halt"], opt_in_keywords=["weiter"])
    assert reply_intent(keyword_of("HALT", vocabulary([custom])), custom) == "opt_out"
    assert reply_intent(keyword_of("STOP", vocabulary([custom])), custom) is None
    with pytest.raises(ValueError):
        Route(inbox_id=2, channel="sms", opt_out_keywords=["STOP"], opt_in_keywords=["stop"])


@pytest.mark.parametrize(("error", "scope"), [
    ("21610: Attempt to send to unsubscribed recipient", ("sms", "*")),
    ("(#131050) Unable to deliver the message", ("messaging_platform", "marketing")),
    ("131026: Message undeliverable", None),
    ("216100: something else", None),
    (None, None),
])
def test_provider_codes_that_mean_an_opt_out(error: str | None, scope: tuple[str, str] | None) -> None:
    found = opt_out_scope(error, channel="sms")
    assert (None if found is None else (found.channel, found.category)) == scope


def test_a_recipient_key_the_caller_invented_is_never_repeated() -> None:
    from dispatcher.errors import InvalidEvent
    from dispatcher.recipients.controls import recipient_of

    with pytest.raises(InvalidEvent) as refused:
        recipient_of({"+15551234567": "x", "identifier": "p-1"})
    assert "+15551234567" not in str(refused.value) and refused.value.field == "recipient.*"
