"""choose_message_kind and template_params: the contract's channel rules as a table."""

from __future__ import annotations

import pytest

from dispatcher.errors import InvalidEvent
from dispatcher.policy.channels import MessageKind, choose_message_kind, template_params
from dispatcher.settings import ChannelKind, Template

P, T, F = ChannelKind.MESSAGING_PLATFORM, MessageKind.TEMPLATE, MessageKind.FREE_TEXT
OTHERS = [ChannelKind.WEB_SESSION, ChannelKind.SMS, ChannelKind.EMAIL, ChannelKind.OTHER]

# channel, template_required, window_open, has_template -> kind
TABLE = [
    (P, False, True, True, F),  # inside the window free text is allowed
    (P, False, True, False, F),
    (P, False, False, True, T),  # outside it only a template
    (P, True, True, True, T),  # the route forces a template
    (P, True, False, True, T),
] + [(channel, required, window, has, F)
     for channel in OTHERS for required in (False, True) for window in (False, True) for has in (False, True)]


@pytest.mark.parametrize(("channel", "template_required", "window_open", "has_template", "kind"), TABLE)
def test_message_kind_table(channel: ChannelKind, template_required: bool, window_open: bool,
                            has_template: bool, kind: MessageKind) -> None:
    # given a channel, the route's flag, the window and the notification
    # when choosing; then the kind is the contract's
    assert choose_message_kind(channel=channel, template_required=template_required,
                               window_open=window_open, has_template=has_template) is kind


@pytest.mark.parametrize(("template_required", "window_open", "words"),
                         [(False, False, "window"), (True, True, "route requires"),
                          (True, False, "route requires")])
def test_a_needed_template_that_is_missing_is_refused(template_required: bool, window_open: bool,
                                                     words: str) -> None:
    # given a platform send that needs a template and a notification without one
    # when choosing; then InvalidEvent names the template field and says why
    with pytest.raises(InvalidEvent) as caught:
        choose_message_kind(channel=P, template_required=template_required,
                            window_open=window_open, has_template=False)
    assert caught.value.field == "template" and words in caught.value.problem


REMINDER = Template(name="appointment_reminder", language="en", category="UTILITY", body_params=2)


def test_template_params_has_the_contract_shape() -> None:
    # given a registered template and its two positional parameters
    # when building template_params
    params = template_params(REMINDER, {"2": "10:30", "1": "Ada"})
    # then all four fields are there and the body keys are strings from "1", in order
    assert params == {"name": "appointment_reminder", "category": "UTILITY", "language": "en",
                      "processed_params": {"body": {"1": "Ada", "2": "10:30"}}}
    assert list(params["processed_params"]["body"]) == ["1", "2"]


def test_template_without_parameters_sends_empty_processed_params() -> None:
    # given a template taking no parameters; when building; then processed_params is empty
    bare = Template(name="hello", language="de", category="UTILITY", body_params=0)
    assert template_params(bare, {})["processed_params"] == {}


@pytest.mark.parametrize("body", [{"1": "a"}, {"1": "a", "2": "b", "3": "c"}, {"1": "a", "3": "c"},
                                  {"0": "a", "1": "b"}, {"01": "a", "2": "b"}, {"one": "a", "2": "b"},
                                  {"1": "a", "2": 5}])
def test_template_params_refuses_a_wrong_body(body: dict[str, object]) -> None:
    # given the wrong count, a gap, a bad key or a non-string value
    # when building; then InvalidEvent on template.body that repeats no value
    with pytest.raises(InvalidEvent) as caught:
        template_params(REMINDER, body)  # type: ignore[arg-type]
    assert caught.value.field == "template.body"
    assert "10:30" not in str(caught.value) and "'a'" not in str(caught.value)


def test_template_params_accepts_a_template_without_a_count() -> None:
    # given a request-side template that names itself but does not say how many parameters
    class Ref:
        name, language, category = "promo", "en", "MARKETING"

    # when building; then only the gap rule applies
    assert template_params(Ref(), {"1": "x"})["processed_params"] == {"body": {"1": "x"}}
