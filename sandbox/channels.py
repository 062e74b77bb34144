"""Channel rules and delivery-state progression of outgoing messages.

What a real channel does after the API has answered 200 is simulated here: the message starts as
``sent`` (or null), then becomes ``delivered`` and ``read`` after configured delays, or ``failed``
with an ``external_error`` from the field notes. Failures are always reported asynchronously, as the
real service reports them, never as an error answer to createMessage.

Rules, checked in this order for an outgoing, non-private message without ``source_id``:

1. business-messaging platform (``Channel::Whatsapp``) with ``template_params``: unknown template or
   language -> ``132001``; wrong number of body parameters -> ``132000``;
2. platform, free text outside the customer-service window -> ``131047``;
3. recipient rules by phone prefix: ``fail`` with their external_error, ``never_confirm``, or
   ``regress`` (delivered, then a late ``sent``: the field's out-of-order callbacks; then read,
   unless the rule says ``then_read = false``: the recipient never opens it, and the stored
   status stays ``sent`` although the message arrived).

SMS, e-mail and web-session channels never report ``read`` (the SMS provider and the mail server
know nothing of it): there a message ends ``delivered``. ``CHANNELS_WITHOUT_READ`` names them.

On the platform and SMS channels the provider takes the message first: ``provider_id_after_s``
after the send, the message gets the provider's id as its ``source_id`` (``wamid.…`` / ``SM…``)
and a ``message_updated`` announces it while the status is still ``sent``, as the real service
does. A request the provider refuses at once (template errors, throughput) gets no provider id.

Timers are ``loop.call_later`` callbacks, cheap enough for thousands of messages a second. Each
transition is chained from the previous one, so ``read`` can never overtake ``delivered``. The
plan is kept on the message, so a restarted sandbox resumes what its timers had left to do.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal

from sandbox.config import (
    CHANNEL_EMAIL,
    CHANNEL_PLATFORM,
    CHANNEL_SMS,
    CHANNEL_WEB_SESSION,
    Behaviour,
    Inbox,
    RecipientRule,
)
from sandbox.records import ContactRec, MessageRec
from sandbox.state import Store

ERROR_UNDELIVERABLE = "131026: Message undeliverable"
ERROR_WINDOW_CLOSED = "131047: Re-engagement message"
ERROR_PARAM_COUNT = "132000: Number of parameters does not match the expected number of params"
ERROR_NO_TEMPLATE = "132001: Template name does not exist in the translation"
ERROR_THROUGHPUT = "130429: Rate limit hit"
ERROR_UNSUBSCRIBED = "21610: Attempt to send to unsubscribed recipient"
ERROR_MARKETING_STOPPED = ("131050: Unable to deliver the message. This recipient has chosen to stop receiving "
                           "marketing messages on WhatsApp from your business")
# The SMS provider's own keywords (Twilio's): a whole reply that opts the number out, or back in.
SMS_OPT_OUT_WORDS = frozenset({"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "REVOKE", "OPTOUT"})
SMS_OPT_IN_WORDS = frozenset({"START", "YES", "UNSTOP"})
TEMPLATE_SECTIONS = frozenset({"body", "header", "buttons", "footer"})
# Refused by the provider in its answer to the send, so no provider message id ever exists.
SYNCHRONOUS_ERRORS = frozenset({ERROR_PARAM_COUNT, ERROR_NO_TEMPLATE, ERROR_THROUGHPUT, ERROR_UNSUBSCRIBED})
# Channels whose provider never tells that a message was read: delivered is their last status.
CHANNELS_WITHOUT_READ = frozenset({CHANNEL_SMS, CHANNEL_EMAIL, CHANNEL_WEB_SESSION})
# Delivery statuses in the order a message reaches them; ``MessageRec.highest_status`` keeps the
# furthest one, whatever a late callback stores afterwards.
STATUS_ORDER = ("sent", "delivered", "read")


class SlidingWindow:
    """Counts events per key over the last ``window_s`` seconds (monotonic clock)."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._events: dict[Hashable, deque[float]] = {}

    def count(self, key: Hashable) -> int:
        events = self._events.get(key)
        if not events:
            return 0
        horizon = self.clock() - self.window_s
        while events and events[0] <= horizon:
            events.popleft()
        return len(events)

    def add(self, key: Hashable) -> None:
        self._events.setdefault(key, deque()).append(self.clock())


def count_body_params(processed_params: dict[str, Any]) -> int:
    """Body parameters in either shape: ``{"body": {"1": ..}}`` or the legacy flat ``{"1": ..}``."""
    body = processed_params.get("body")
    if isinstance(body, dict):
        return len(body)
    return sum(1 for key in processed_params if key not in TEMPLATE_SECTIONS)


def template_error(inbox: Inbox, template_params: dict[str, Any]) -> str | None:
    same_name = [t for t in inbox.templates if t.name == template_params.get("name")]
    match = next((t for t in same_name if t.language == template_params.get("language")), None)
    if match is None:
        return ERROR_NO_TEMPLATE
    if count_body_params(template_params.get("processed_params") or {}) != match.body_params:
        return ERROR_PARAM_COUNT
    return None


def template_category(inbox: Inbox, template_params: dict[str, Any]) -> str | None:
    """The category the platform approved the template under (not what the request claims)."""
    match = next((t for t in inbox.templates if t.name == template_params.get("name")
                  and t.language == template_params.get("language")), None)
    return match.category if match is not None else None


def sms_keyword(content: str | None) -> bool | None:
    """A reply the SMS provider acts on itself: True opts out, False opts back in, None neither."""
    word = " ".join((content or "").split()).upper()
    if word in SMS_OPT_OUT_WORDS:
        return True
    if word in SMS_OPT_IN_WORDS:
        return False
    return None


Effect = Literal["progress", "fail", "never_confirm", "regress", "regress_unread", "hold"]


@dataclass(frozen=True)
class Plan:
    """What the channel will do with an accepted outgoing message."""

    effect: Effect
    external_error: str | None = None

    @property
    def reaches_provider(self) -> bool:
        return self.effect != "hold" and self.external_error not in SYNCHRONOUS_ERRORS


def matching_rule(rules: list[RecipientRule], inbox: Inbox, contact: ContactRec) -> RecipientRule | None:
    phone = contact.phone_number or ""
    for rule in rules:
        if (not rule.inbox_ids or inbox.id in rule.inbox_ids) and phone.startswith(rule.phone_prefix):
            return rule
    return None


class Channels:
    """Decides each outgoing message's fate and plays it out on the event loop."""

    def __init__(
        self,
        behaviour: Behaviour,
        rules: list[RecipientRule],
        store: Store,
        *,
        on_status: Callable[[MessageRec], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.behaviour = behaviour
        self.rules = rules
        self.store = store
        self.on_status = on_status
        self.sends = SlidingWindow(60.0, monotonic)  # per inbox, for sends_per_minute
        self.conversation_messages = SlidingWindow(60.0, monotonic)  # per conversation
        self.cancelled = False

    def cancel(self) -> None:
        """Stop every pending transition (used by reset: the old store is thrown away)."""
        self.cancelled = True

    def over_send_cap(self, inbox: Inbox) -> bool:
        return inbox.sends_per_minute is not None and self.sends.count(inbox.id) >= inbox.sends_per_minute

    def window_open(self, contact_id: int, inbox_id: int) -> bool:
        opened = self.store.last_incoming_at.get((contact_id, inbox_id))
        return opened is not None and self.store.clock() - opened < self.behaviour.service_window_s

    def plan(self, inbox: Inbox, contact: ContactRec, template_params: dict[str, Any] | None) -> Plan:
        if inbox.channel_type == CHANNEL_SMS and contact.sms_opted_out:
            return Plan("fail", ERROR_UNSUBSCRIBED)
        if inbox.channel_type == CHANNEL_PLATFORM:
            if template_params is not None:
                error = template_error(inbox, template_params)
                if error:
                    return Plan("fail", error)
                if contact.marketing_opted_out and template_category(inbox, template_params) == "MARKETING":
                    return Plan("fail", ERROR_MARKETING_STOPPED)
            elif not self.window_open(contact.id, inbox.id):
                return Plan("fail", ERROR_WINDOW_CLOSED)
        rule = matching_rule(self.rules, inbox, contact)
        if rule is not None:
            if rule.effect == "fail":
                return Plan("fail", rule.external_error)
            if rule.effect == "regress" and not rule.then_read:
                return Plan("regress_unread")
            return Plan(rule.effect)
        return Plan("progress")

    def start(self, message: MessageRec) -> None:
        """Play out the plan stored on a just-stored message (see :meth:`plan`)."""
        self._schedule(message, elapsed_s=0.0)

    def resume(self, message: MessageRec) -> None:
        """After a restart: carry on from the message's stored status, with full delays."""
        if message.status in ("failed", "read"):
            return
        if message.status == "delivered":
            self._after_delivered(message)
        else:
            self._schedule(message, elapsed_s=0.0)

    def _provider_prefix(self, message: MessageRec) -> str | None:
        kind = self.store.inboxes[message.inbox_id].channel_type
        plan = Plan(message.plan_effect, message.plan_error)  # type: ignore[arg-type]
        if message.source_id is not None or not plan.reaches_provider:
            return None
        return {CHANNEL_PLATFORM: "wamid.", CHANNEL_SMS: "SM"}.get(kind)

    def _schedule(self, message: MessageRec, *, elapsed_s: float) -> None:
        loop = asyncio.get_running_loop()
        prefix = self._provider_prefix(message)
        if prefix is not None:
            delay = self.behaviour.provider_id_after_s
            loop.call_later(delay, self._acknowledge, message, prefix, delay)
        elif message.plan_effect == "fail":
            loop.call_later(max(0.0, self.behaviour.failed_after_s - elapsed_s), self._fail, message)
        elif message.plan_effect in ("progress", "regress", "regress_unread"):
            loop.call_later(max(0.0, self.behaviour.delivered_after_s - elapsed_s), self._advance, message, "delivered")

    def _acknowledge(self, message: MessageRec, prefix: str, elapsed_s: float) -> None:
        """The provider took the message: its id becomes the source_id; the status stays as it is."""
        if self.cancelled or message.status == "failed":
            return
        message.source_id = prefix + self.store.provider_message_id(prefix)
        message.updated_at = self.store.clock()
        self.store.save_message(message)
        self.on_status(message)
        self._schedule(message, elapsed_s=elapsed_s)

    def _fail(self, message: MessageRec) -> None:
        if self.cancelled or message.status == "failed":
            return
        message.content_attributes["external_error"] = message.plan_error or ERROR_UNDELIVERABLE
        self._set(message, "failed")

    def _advance(self, message: MessageRec, status: str) -> None:
        if self.cancelled or message.status == "failed":
            return
        self._set(message, status)
        if status == "delivered":
            self._after_delivered(message)

    def _after_delivered(self, message: MessageRec) -> None:
        loop = asyncio.get_running_loop()
        if message.plan_effect in ("regress", "regress_unread"):
            loop.call_later(self._late_sent_after_s(), self._regress, message)
        elif self._reports_read(message):
            loop.call_later(self.behaviour.read_after_s, self._advance, message, "read")

    def _late_sent_after_s(self) -> float:
        """When the late ``sent`` follows ``delivered``: the setting, else half of read_after_s."""
        late = self.behaviour.late_sent_after_s
        return self.behaviour.read_after_s / 2 if late is None else late

    def _reports_read(self, message: MessageRec) -> bool:
        return self.store.inboxes[message.inbox_id].channel_type not in CHANNELS_WITHOUT_READ

    def _regress(self, message: MessageRec) -> None:
        """A late ``sent`` callback after ``delivered``: the stored status goes back, as in the field.
        Then read, ``read_after_s`` after delivered (at once if the late ``sent`` came later), unless
        the recipient never opens it (``regress_unread``) or the channel never reports it."""
        if self.cancelled or message.status != "delivered":
            return
        reads = message.plan_effect == "regress" and self._reports_read(message)
        message.plan_effect = "progress" if reads else "hold"  # once: after a restart it is not played again
        self._set(message, "sent")
        if reads:
            rest_s = max(0.0, self.behaviour.read_after_s - self._late_sent_after_s())
            asyncio.get_running_loop().call_later(rest_s, self._advance, message, "read")

    def _set(self, message: MessageRec, status: str) -> None:
        if status in STATUS_ORDER and (message.highest_status not in STATUS_ORDER
                                       or STATUS_ORDER.index(status) > STATUS_ORDER.index(message.highest_status)):
            message.highest_status = status
        message.status = status
        message.updated_at = self.store.clock()
        self.store.save_message(message)
        self.on_status(message)
