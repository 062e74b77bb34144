"""The promises, checked after every step of a simulated run.

Safety (each a :class:`~tests.simulation.world.Violation` when broken):

* ``one_message``: at most one message per event and route in the workspace; besides it, at most
  one free text the platform refused outside the service window (131047), which the approved
  template then replaced (the lifecycle's ``resend_as_template``).
* ``one_fallback``: the fallback decision is written once and never changes, nor does its reason or
  its time; at most one fallback attempt.
* ``forward_only``: a notification's and an attempt's state only take the lifecycle table's edges
  (dispatcher/lifecycle/table.py, its own MOVES: read, not copied), possibly several in one step.
* ``no_send_after_opt_out``: no message whose claim came after the recipient's opt-out was committed.
* ``no_send_after_cancel``: no message of an event appears in the workspace after the step in
  which its notification's cancel committed (the messages it had then are remembered).
* ``tries_bounded``: an attempt never counts more than ``retry_max_tries`` tries, and makes no more
  createMessage calls than that.
* ``tries_spent_on_calls``: an attempt that ends ``tries_exhausted`` made at least
  ``retry_max_tries`` calls that reached the workspace (redeliveries and crashes spend none): the
  notification's send tasks, all calls counted, refused connections not; and a notification's
  attempts together count no more tries than such calls.
* ``no_fallback_after_delivery``: no fallback decided for a message the workspace reports delivered or read.
* ``no_fallback_once_delivered``: no fallback for a message that was ever delivered or read, whatever
  a late callback stored after it (the sandbox's ``highest_status``; :func:`_no_fallback_once_delivered`).
* ``ended_with_reason``: a failed notification or attempt says why (error_kind and a detail); a
  kind never stands without its detail in words, nor a detail without its kind, on any row (a
  waiting notification's reason, an attempt's mark); no detail says ``None``; a failed
  notification's kind is its current attempt's (:func:`_reasons_in_words`).
* ``says_why`` (checked by the scheduler as each send task returns): a run that did not send says
  why, and one that retries says after how long (the task's result, what Flower shows).
* ``published_at_once`` (checked by the scheduler as a send or consumer run ends without crashing):
  its notification, when due to be sent, has a send task in the broker; the sweep is for crashes,
  not for work a run that lived left undone (World._left_to_the_sweep says when it is not judged);
  and as beat's sweeps end, no row due when they began is without one (World._left_by_the_sweep).
* ``marked_before_publish`` (checked by the scheduler at each publish of a send task): the run that
  publishes it marked the row enqueued first, in the same run (World._marked_before_publish).
* ``consumer_error`` (checked by the scheduler): the outcome consumer never fails on a delivery but
  for a failed read of the workspace (an incoming customer message once crashed it).
* ``on_time``: no message of a scheduled notification appears before its ``send_at`` (as the host
  last moved it).
* ``host_told``: every state a host is told of (accepted, sent, delivered, read, fell back, failed,
  cancelled) has its outcome callback for the current attempt, written in the move's transaction;
  at the end, each notification's callbacks are numbered without a gap and only move forward. A
  cancel answers too late only when a run claimed the current attempt or it is not queued
  (checked by the scheduler as the host's cancel returns).
* ``visibly_waiting`` (checked by the scheduler as each send task returns): a run that waits for
  quiet hours or a paused workspace leaves the notification showing why, unless the wait is
  already over (another run claimed the attempt since, or the notification moved on).
* ``content_goes``: a notification's content is deleted once no send can follow
  (:func:`_content_goes`).
* ``logs_private``: every line our code logs formats cleanly (its arguments fit its message), says
  something (a message, no ``None`` among its arguments) and holds no phone number, no message
  content and no token: what an operator's log would show.
* ``bug_raised``: no line our code logs names an error only a bug raises (a ``TypeError``, an
  ``AttributeError``...): the consumer keeps a delivery's failure and goes on, and a read-back
  learns the outcome anyway, so such a bug breaks no other promise and would pass unseen.
* ``free_text_in_window``: on the platform, free text goes while the customer-service window is
  open; a template only where the route requires one or the window has closed.
* ``template_resend``: free text the platform refused outside the service window (131047) is resent
  as the request's approved template, never a reason to fall back.
* ``quiet_hours``: no message appears outside its route's send window (in the worlds that set one).
* ``true_reason``: an error_kind says what happened: it is one that docs/notifications.md lists
  ("Error kinds"); ``opted_out`` only for a recipient who said
  no (the host suppressed it, or it replied STOP); ``rejected`` and ``not_found`` only after a
  call of its send tasks was answered 422 or 404; ``external_error`` only when a message of its
  event failed in the workspace; ``crash_loop`` only while its attempt's runs are past
  ``send_max_runs``; ``cancelled`` only when the host asked to cancel it; never ``no_consent`` (no route of these worlds needs consent);
  and a fallback decided "not delivered by the deadline" only for a message whose failure the
  store did not hold yet (else the failure's reason decides); a decision's reason names the
  failure it follows (``send_failed (<kind>)``) and never says ``None``; and a notification whose
  last message failed with a provider's opt-out code ends ``opted_out``.
* ``record_matches``: what the store says was sent is what the workspace holds: an attempt with a
  message ID names that message's inbox (its route's), conversation and contact, the message carries
  its notification's event, and the notification's record names one of its attempts' messages; an
  attempt in flight names where its call goes and holds a lease, and only an attempt in flight holds
  one; a reported or failed attempt has the time of its status; an ended notification shows its end
  as its delivery state; a decision is ``fallback`` or ``none`` and says why and when; a row's ``updated_at`` never runs back and
  moves whenever its state does; a failed notification has its fallback decision; its channel is
  that of the attempt whose message it shows; an attempt a cancel ended belongs to a cancelled
  notification and a cancelled one has such an attempt; a queued notification with no message to
  show names no inbox but its current attempt's; a scheduled notification waits for a time
  its host asked for; a send run that
  ends without crashing leaves no attempt it claimed in flight (World._left_in_flight).
* ``falls_back_as_documented``: a decision that follows a first attempt's (or its template
  resend's) failure falls back exactly when docs/notifications.md's "Error kinds" table says that
  kind does ("yes") and the notification has a configured fallback route; never for a "no" (the
  table is read, not copied; kinds that depend on a provider's code are left to ``true_reason``).
* ``outcome_word``: a run's outcome word is one docs/tracking.md lists ("Outcome words") and
  agrees with the store and the workspace (:func:`_outcome_words`).
* ``traced`` (worlds with tracing on): every send run's and outcome's span lies in its
  notification's own trace; a send run that ended says its outcome and workspace; an outcome's
  span names the attempt, message, state and status; an outcome the consumer applied has its span.

At the end of a run that settled:

* ``stop_honoured``: a recipient whose STOP reply our receiver recorded is suppressed on that channel.
* ``message_known``: every message the workspace holds for an event is the recorded message of one
  of its notification's attempts on that inbox, unless that attempt ended ``outcome_unknown`` (it
  says it may exist). A message sent while its attempt was failed by another run would be unknown.

Liveness: once faults stop, every notification ends (delivered, read or failed; for a recipient
whom no channel ever confirms, or whose messages regress to a late ``sent`` and are never read,
``sent`` by its last route after the single fallback decision,
which is all the provider will ever say) within
:data:`SETTLE_BOUND_S` of simulated time; the scheduler reports a run that stops or runs out of
time before that as ``liveness``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import NamedTuple

from dispatcher.lifecycle.announce import EVENT_OF_STATE
from dispatcher.lifecycle.moves import CANCELLED, CRASH_LOOP
from dispatcher.lifecycle.states import AttemptState, NotificationState, rank
from dispatcher.lifecycle.table import MOVES, NEW
from dispatcher.recipients.controls import recipient_of
from dispatcher.sending.send import Outcome
from sandbox.records import MessageRec
from tests.simulation.world import Said, Violation, World, as_time

WINDOW_CLOSED = "131047"
REPORTED = frozenset({AttemptState.ACCEPTED, AttemptState.SENT, AttemptState.DELIVERED, AttemptState.READ,
                      AttemptState.FAILED})
ENDED_BY_DELIVERY = frozenset({NotificationState.DELIVERED, NotificationState.READ, NotificationState.FAILED})
ENDED = ENDED_BY_DELIVERY | {NotificationState.CANCELLED}
EVENT_IN_CONTENT = re.compile(r"Reminder (ev-\d+):")
DECISIONS = ("fallback", "none")  # what a fallback decision says (docs/tracking.md, "The single fallback decision")
DEADLINE_REASON = "not delivered by the deadline"  # the tracking sweep's reason (docs/tracking.md)
ROUTE_INBOX = {"reminders": 1, "sms": 2}
CHANNEL_OF_INBOX = {1: "messaging_platform", 2: "sms"}

# Once faults stop, every notification ends within this much simulated time at the default
# settings (docs/simulation.md derives it): a lost worker's task returns after the visibility
# timeout (30 s) and a task lost otherwise is found by the sweep after stale_after_s (45 s; a
# task published and not started once the send queue is empty too, at once in these worlds); a
# createMessage call's lease (45 s) may hold it up once more; a first attempt's delivery deadline
# (900 s) and the fallback's own sends (under 600 s) come after that. The test suite checks that
# the example configuration still has these values (test_the_liveness_bound_follows_the_settings).
FALLBACK_SETTLE_S = 600.0
SETTLE_BOUND_S = 30.0 + 45.0 + 45.0 + 900.0 + FALLBACK_SETTLE_S


@cache
def _reachable(side: str) -> dict[str, frozenset[str]]:
    """Every state reachable from each state by the table's edges (the transitive closure)."""
    step: dict[str, set[str]] = defaultdict(set)
    for move in MOVES.values():
        chosen = getattr(move, side)
        if chosen is None:
            continue
        for start, end in chosen.edges:
            if start != NEW:
                step[start].add(end)
    closure: dict[str, frozenset[str]] = {}
    for state in list(step):
        seen, todo = {state}, [state]
        while todo:
            for nxt in step.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        closure[state] = frozenset(seen)
    return closure


def check(world: World) -> list[Violation]:
    world.clock.advance_to(world.clock.now + 0.001)  # each step takes a moment: commits are ordered in time
    found: list[Violation] = []
    memory = world.memory
    messages = world.workspace.outgoing()
    per_route = Counter()
    refused_free_text = Counter()
    messages_of: dict[str, list[MessageRec]] = defaultdict(list)  # event ID -> its messages
    for message in messages:
        match = EVENT_IN_CONTENT.match(message.content or "")
        if match:
            messages_of[match.group(1)].append(message)
            if message.template_params is None and (message.external_error or "").startswith(WINDOW_CLOSED):
                refused_free_text[(match.group(1), message.inbox_id)] += 1  # the platform refused it: nobody got it
            else:
                per_route[(match.group(1), message.inbox_id)] += 1
    for (event_id, inbox_id), count in per_route.items():
        if count > 1 + _retried_on(world, event_id, inbox_id):
            found.append(Violation("one_message", f"{event_id} has {count} messages in inbox {inbox_id}"))
    for (event_id, inbox_id), count in refused_free_text.items():
        if count > 1:
            found.append(Violation("one_message", f"{event_id} has {count} free texts refused with 131047 in inbox {inbox_id}"))
    raw = world.raw  # plain SQL on the run's own connection: the checks cost little beside the real code
    notifications = [_Row(*row) for row in raw.execute(
        "SELECT id, event_id, state, error_kind, fallback_decision, route, error_detail, current_attempt FROM notifications")]
    attempts = [_Attempt(*row) for row in raw.execute(
        "SELECT notification_id, number, purpose, state, tries, in_flight_since, route, error_kind, error_detail "
        "FROM attempts")]
    suppressions = [(key, channel, as_time(since)) for key, channel, since in raw.execute(
        "SELECT recipient_key, channel, since FROM suppressions")] if world.spec.opt_outs else []
    states: dict[tuple[str, int], str] = memory.setdefault("states", {})
    decisions: dict[int, str] = memory.setdefault("decisions", {})
    fallbacks = Counter(a.notification_id for a in attempts if a.purpose == "fallback")
    event_of = {n.id: n.event_id for n in notifications}
    for n in notifications:
        _forward(found, states, "notification", ("n", n.id), n.state)
        if n.fallback_decision is not None:
            if n.id not in decisions:
                found += _deadline_decision_on_a_live_message(world, n)
            if n.fallback_decision not in DECISIONS:
                found.append(Violation("record_matches", f"{n.event_id}: fallback decision {n.fallback_decision!r}"))
            before = decisions.setdefault(n.id, n.fallback_decision)
            if before != n.fallback_decision:
                found.append(Violation("one_fallback", f"{n.event_id}: decision {before} became {n.fallback_decision}"))
            elif n.fallback_decision == "fallback" and "fallback_checked" not in memory.setdefault(f"n{n.id}", {}):
                memory[f"n{n.id}"]["fallback_checked"] = True
                first_inbox = ROUTE_INBOX.get(n.route)
                for message in messages:
                    match = EVENT_IN_CONTENT.match(message.content or "")
                    if (match and match.group(1) == n.event_id and message.inbox_id == first_inbox
                            and message.status in ("delivered", "read")):
                        found.append(Violation("no_fallback_after_delivery",
                                               f"{n.event_id}: fallback decided while message {message.id} is {message.status}"))
        if fallbacks[n.id] > 1:
            found.append(Violation("one_fallback", f"{n.event_id} has {fallbacks[n.id]} fallback attempts"))
        found += _no_fallback_once_delivered(world, n, fallbacks[n.id], messages_of.get(n.event_id, []))
    max_tries = world.settings.retry_max_tries
    calls = memory.get("send_calls", {})
    tries_of: Counter[int] = Counter()
    for a in attempts:
        tries_of[a.notification_id] += a.tries
        _forward(found, states, "attempt", ("a", a.notification_id, a.number), a.state)
        if a.tries > max_tries:
            found.append(Violation("tries_bounded", f"{event_of.get(a.notification_id)} attempt {a.number} "
                                   f"counted {a.tries} tries (limit {max_tries})"))
        if a.state == AttemptState.FAILED and a.error_kind == "tries_exhausted":
            reached = calls.get(a.notification_id, 0)
            if reached < max_tries:
                found.append(Violation("tries_spent_on_calls", f"{event_of.get(a.notification_id)} attempt {a.number} "
                                       f"ended tries_exhausted after {reached} calls of its send tasks reached the "
                                       f"workspace ({a.tries} tries counted)"))
    for nid, tries in tries_of.items():
        if tries > calls.get(nid, 0):
            found.append(Violation("tries_spent_on_calls", f"{event_of.get(nid)}: its attempts count {tries} provider "
                                   f"tries, but only {calls.get(nid, 0)} calls of its send tasks reached the workspace"))
    found += _reasons_in_words(notifications, attempts, event_of)
    found += _opt_outs(world, messages, attempts, suppressions, event_of)
    found += _cancels(world, messages, notifications)
    found += _host_told(world)
    found += _on_time(world, messages)
    found += _records_match(world, messages, event_of)
    found += _content_goes(world)
    found += _free_text_in_window(world, messages)
    found += _true_reasons(world, messages, event_of)
    found += _traced(world)  # before _outcome_words, which takes the words said
    found += _outcome_words(world)
    found += _logs(world)
    if len(world.handed_over) == len(world.requests) and notifications and all(_ended(n, world) for n in notifications):
        if memory.get("all_ended_at") is None:
            memory["all_ended_at"] = world.clock.now
            memory["ends"] = dict(Counter(n.error_kind or n.state for n in notifications))
            settle = world.clock.now - world.last_fault_at
            if settle > SETTLE_BOUND_S:
                found.append(Violation("liveness", f"settled {settle:.0f} s after the last fault (bound {SETTLE_BOUND_S:.0f} s)"))
    else:
        memory["all_ended_at"] = None
    return found


def _deadline_decision_on_a_live_message(world: World, n: _Row) -> list[Violation]:
    """Checked in the step that wrote the decision: a deadline decision is for a message still
    undelivered, never for one whose failure the store already held (that failure's reason
    decides, as the failure's own decision would have: "undeliverable (131026)", not "not
    delivered by the deadline")."""
    row = world.raw.execute(
        "SELECT n.fallback_reason, n.fallback_decided_at, a.state, a.status_at, a.error_kind, a.purpose, n.fallback_route "
        "FROM notifications n "
        "JOIN attempts a ON a.notification_id = n.id AND a.number = n.current_attempt"
        " - CASE WHEN n.fallback_decision = 'fallback' THEN 1 ELSE 0 END WHERE n.id = ?", (n.id,)).fetchone()
    if row is None:
        return []
    reason, decided_at, state, status_at, error_kind, purpose, fallback_route = row
    if (reason or "").startswith(DEADLINE_REASON) and state == AttemptState.FAILED and status_at is not None \
            and as_time(status_at) < as_time(decided_at):
        return [Violation("true_reason", f"{n.event_id}: decided '{reason}' after its message's failure was recorded")]
    if "None" in (reason or "") or (
            (reason or "").startswith("send_failed (") and state == AttemptState.FAILED
            and not reason.startswith(f"send_failed ({error_kind})")):
        return [Violation("true_reason", f"{n.event_id}: decided for the reason '{reason}' after a failure {error_kind}")]
    documented = documented_fallbacks().get(error_kind or "")
    if state != AttemptState.FAILED or purpose not in ("first", "template") or documented is None:
        return []  # a deadline's decision, or a kind whose fallback depends on more (a provider's code)
    can_fall_back = fallback_route is not None and fallback_route in world.settings.routes
    if (n.fallback_decision == "fallback") != (documented and can_fall_back):
        return [Violation("falls_back_as_documented", f"{n.event_id}: decided {n.fallback_decision} after a failure "
                          f"{error_kind}, which docs/notifications.md says {'falls' if documented else 'does not fall'} back")]
    return []


def _no_fallback_once_delivered(world: World, n: _Row, fallback_attempts: int, of_event: list[MessageRec]) -> list[Violation]:
    """``no_fallback_once_delivered``: once a notification falls back (its decision says so, or a
    fallback attempt or a message on its fallback route exists), no message of its first route
    made before that ever reached delivered or read in the workspace, whatever a late callback
    stored after it (the sandbox's ``highest_status``): the recipient had it, and the fallback is a
    second message. The first route's messages are those its inbox held for the event when the
    fallback was first seen (the first attempt's, and its template resend's); a host's retry on
    that route, later, is not one of them."""
    remembered = world.memory.setdefault(f"n{n.id}", {})
    first_messages: set[int] | None = remembered.get("first_messages")
    if first_messages is None:
        request = world.requests[int(n.event_id.split("-")[1])]
        first_inbox = ROUTE_INBOX.get(request.route or "")
        fallback_inbox = ROUTE_INBOX.get(request.fallback_route or "")
        fell_back = (n.fallback_decision == "fallback" or fallback_attempts > 0
                     or (fallback_inbox is not None and any(m.inbox_id == fallback_inbox for m in of_event)))
        if not fell_back:
            return []
        first_messages = remembered["first_messages"] = {m.id for m in of_event if m.inbox_id == first_inbox}
    found = []
    for message in of_event:
        reached = message.highest_status or message.status
        if message.id in first_messages and reached in ("delivered", "read"):
            found.append(Violation("no_fallback_once_delivered", f"{n.event_id}: fell back though its first route's "
                                   f"message {message.id} reached {reached} (the workspace now says {message.status})"))
    return found


def _retried_on(world: World, event_id: str, inbox_id: int) -> int:
    """Retries the host asked for, each a deliberate message on the notification's own route."""
    retries = world.retries.get(event_id, 0)
    if not retries:
        return 0
    request = world.requests[int(event_id.split("-")[1])]
    return retries if ROUTE_INBOX.get(request.route or "") == inbox_id else 0


def _ended(n: _Row, world: World) -> bool:
    if n.state in ENDED:
        return True
    # The provider never confirms this recipient: after the deadline's single decision, the last
    # route's message accepted (`sent`) is the end: nothing more will be sent or said. So too for a
    # recipient whose messages regress to a late `sent` and are never read (kind 12): `sent` is the
    # workspace's last word (what the record then says is the product's to document, issue 44).
    return ((n.event_id in world.never_confirmed or n.event_id in world.late_sent)
            and n.state == NotificationState.SENT and n.fallback_decision is not None)


class _Row(NamedTuple):
    id: int
    event_id: str
    state: str
    error_kind: str | None
    fallback_decision: str | None
    route: str
    error_detail: str | None
    current_attempt: int


class _Attempt(NamedTuple):
    notification_id: int
    number: int
    purpose: str
    state: str
    tries: int
    in_flight_since: datetime | None
    route: str
    error_kind: str | None
    error_detail: str | None


# A provider's refusal because the person opted out with it (21610) fails the attempt as
# external_error and the notification as opted_out (docs/notifications.md, "Error kinds").
NOTIFICATION_KIND_OF_ATTEMPT_KIND = {"external_error": frozenset({"external_error", "opted_out"})}


def _reasons_in_words(notifications: list[_Row], attempts: list[_Attempt], event_of: dict[int, str]) -> list[Violation]:
    """``ended_with_reason``: a failed notification or attempt has an error_kind and a detail in
    plain words; a kind never stands without its detail nor a detail without its kind (a waiting
    notification's reason too); a detail never says ``None``; and a failed notification's kind is
    its current attempt's, as the failure that ended it said it."""
    found: list[Violation] = []
    current_kind = {}
    for row in [*notifications, *attempts]:
        side = "notification" if isinstance(row, _Row) else f"attempt {row.number}"
        event_id = row.event_id if isinstance(row, _Row) else event_of.get(row.notification_id)
        detail = (row.error_detail or "").strip()
        if row.state == "failed" and not (row.error_kind and detail):
            found.append(Violation("ended_with_reason", f"{event_id}: {side} failed without an error_kind and a detail"))
        elif bool(row.error_kind) != bool(detail):
            found.append(Violation("ended_with_reason", f"{event_id}: {side} has "
                                   + ("an error_kind without a detail" if row.error_kind else "a detail without an error_kind")))
        elif "None" in detail:
            found.append(Violation("ended_with_reason", f"{event_id}: {side}'s detail says None"))
        if isinstance(row, _Attempt):
            current_kind[(row.notification_id, row.number)] = row.error_kind
    for n in notifications:
        if n.state != NotificationState.FAILED or (n.id, n.current_attempt) not in current_kind:
            continue
        attempt_kind = current_kind[(n.id, n.current_attempt)]
        if attempt_kind and n.error_kind not in NOTIFICATION_KIND_OF_ATTEMPT_KIND.get(attempt_kind, {attempt_kind}):
            found.append(Violation("ended_with_reason", f"{n.event_id}: failed as {n.error_kind}, "
                                   f"its attempt {n.current_attempt} as {attempt_kind}"))
    return found


def _forward(found: list[Violation], states: dict[tuple[str, int], str], side: str, key: tuple, state: str) -> None:
    before = states.get(key)
    if before is not None and before != state and state not in _reachable(side).get(before, frozenset()):
        found.append(Violation("forward_only", f"{side} {key[1:]} went from {before} to {state}"))
    states[key] = state


def _recipient_keys(world: World) -> dict[str, set[str]]:
    """Each event's recipient keys as the suppressions table holds them (keyed hashes), made once a run."""
    keys_of: dict[str, set[str]] | None = world.memory.get("recipient_keys")
    if keys_of is None:
        key = world.settings.hashing_key
        keys_of = world.memory["recipient_keys"] = {
            f"ev-{i}": set(recipient_of({"phone_number": r.contact.phone_number}).keys(key=key))
            for i, r in enumerate(world.requests)}
    return keys_of


def _opt_outs(world: World, messages: list, attempts: list, suppressions: list, event_of: dict[int, str]) -> list[Violation]:
    if not suppressions:
        return []
    keys_of = _recipient_keys(world)
    found = []
    claims = {(event_of.get(a.notification_id), ROUTE_INBOX.get(a.route)): a.in_flight_since for a in attempts}
    for message in messages:
        match = EVENT_IN_CONTENT.match(message.content or "")
        if not match:
            continue
        event_id = match.group(1)
        channel = CHANNEL_OF_INBOX.get(message.inbox_id)
        claimed_at = claims.get((event_id, message.inbox_id))
        claimed = as_time(claimed_at) if claimed_at is not None else None
        for recipient_key, suppressed_channel, since in suppressions:
            if (recipient_key in keys_of.get(event_id, ()) and suppressed_channel in ("*", channel)
                    and claimed is not None and claimed > since):
                found.append(Violation("no_send_after_opt_out", f"{event_id}: message {message.id} on {channel} was "
                                       f"claimed {(claimed - since).total_seconds():.3f} s after the opt-out"))
    return found


def _cancels(world: World, messages: list, notifications: list[_Row]) -> list[Violation]:
    found: list[Violation] = []
    if not world.cancels_asked:
        return found
    before: dict[str, frozenset[int]] = world.memory.setdefault("cancelled_with", {})
    of_event: dict[str, set[int]] = defaultdict(set)
    for message in messages:
        if (match := EVENT_IN_CONTENT.match(message.content or "")) is not None:
            of_event[match.group(1)].add(message.id)
    for n in notifications:
        if n.state != NotificationState.CANCELLED:
            continue
        had = before.setdefault(n.event_id, frozenset(of_event[n.event_id]))  # the step its cancel committed in
        if new := of_event[n.event_id] - had:
            found.append(Violation("no_send_after_cancel", f"{n.event_id}: message(s) {sorted(new)} after its cancel"))
    return found


def _on_time(world: World, messages: list) -> list[Violation]:
    """No message of a scheduled notification appears before its time (as last moved by the host)."""
    seen: set[int] = world.memory.setdefault("messages_seen", set())
    new = [m for m in messages if m.id not in seen]
    if not new:
        return []
    seen.update(m.id for m in new)
    due = {event_id: as_time(send_at) for event_id, send_at in world.raw.execute(
        "SELECT event_id, send_at FROM notifications WHERE send_at IS NOT NULL")}
    now = world.clock.utc()
    found = []
    for message in new:
        match = EVENT_IN_CONTENT.match(message.content or "")
        if match and match.group(1) in due and due[match.group(1)] > now:
            found.append(Violation("on_time", f"{match.group(1)}: message {message.id} sent "
                                   f"{(due[match.group(1)] - now).total_seconds():.1f} s before its time"))
        if match and not _within_quiet_hours(world, message.inbox_id, now):
            found.append(Violation("quiet_hours", f"{match.group(1)}: message {message.id} sent at "
                                   f"{now:%H:%M:%S}, outside its route's send window"))
    return found


# The product checks the window when a run claims the attempt; its createMessage call follows
# within a few steps (a millisecond each), so a message may appear just after the window closed.
WINDOW_SLACK_S = 1.0


def _within_quiet_hours(world: World, inbox_id: int, now: datetime) -> bool:
    """Whether a message in ``inbox_id`` may appear now: its route's send window ("HH:MM-HH:MM",
    UTC, read here from the world's spec, not through the product's parser) holds ``now``."""
    window = dict(world.spec.route_windows).get(next((r for r, i in ROUTE_INBOX.items() if i == inbox_id), ""))
    if window is None:
        return True
    start, end = ([int(part) for part in bound.split(":")] for bound in window.split("-"))
    second = now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6
    return start[0] * 3600 + start[1] * 60 <= second < end[0] * 3600 + end[1] * 60 + WINDOW_SLACK_S


def _host_told(world: World) -> list[Violation]:
    """Every state a host is told of has its callback for the current attempt, written by the move
    that made it (the same transaction: the check runs between steps, so none may be missing)."""
    case = " ".join(f"WHEN '{state}' THEN '{event}'" for state, event in EVENT_OF_STATE.items())
    states = ", ".join(f"'{state}'" for state in EVENT_OF_STATE)
    untold = world.raw.execute(
        f"SELECT n.event_id, n.state, n.current_attempt FROM notifications n WHERE n.state IN ({states}) "
        f"AND NOT EXISTS (SELECT 1 FROM callbacks c WHERE c.notification_id = n.id AND c.attempt = n.current_attempt "
        f"AND c.type = CASE n.state {case} END)").fetchall()
    return [Violation("host_told", f"{event_id} is {state} (attempt {attempt}) and its callback was not written")
            for event_id, state, attempt in untold]


def _records_match(world: World, messages: list, event_of: dict[int, str]) -> list[Violation]:
    found: list[Violation] = []
    by_id = {m.id: m for m in messages}
    conversations = world.workspace.sandbox.store.conversations
    channels = {name: route.channel.value for name, route in world.settings.routes.items()}
    seen: dict[tuple[str, int, int], tuple[tuple[object, ...], str]] = world.memory.setdefault("updated", {})
    messages_of: dict[int, set[int]] = defaultdict(set)
    channel_of_message: dict[int, str] = {}
    cancelled_attempts: set[int] = set()  # notifications with an attempt the host's cancel ended
    inbox_of_attempt: dict[tuple[int, int], int | None] = {}

    def moved(side: str, key: tuple[int, int], record: tuple[object, ...], updated_at: str, what: str) -> None:
        """``record``: what a reader is shown (state first, its reason, its message); when any of it
        changes, updated_at moves with it (an operator's "what changed since" reads it)."""
        before = seen.get((side, *key))
        seen[(side, *key)] = (record, updated_at)
        if before is None:
            return
        old_record, old_updated = before
        if as_time(updated_at) < as_time(old_updated):
            found.append(Violation("record_matches", f"{what}: updated_at ran back"))
        elif old_record != record and updated_at == old_updated:
            found.append(Violation("record_matches", f"{what}: {old_record} -> {record} left updated_at as it was"))

    for (nid, number, route, channel, state, inbox_id, contact_id, conversation_id, message_id, tries, runs, claims,
         lease_until, in_flight_since, accepted_at, status_at, error_kind, error_detail, created_at,
         updated_at) in world.raw.execute(
            "SELECT notification_id, number, route, channel, state, inbox_id, contact_id, conversation_id, message_id, "
            "tries, runs, claims, lease_until, in_flight_since, accepted_at, status_at, error_kind, error_detail, "
            "created_at, updated_at FROM attempts"):
        what = f"{event_of.get(nid)} attempt {number}"
        inbox_of_attempt[(nid, number)] = inbox_id
        moved("a", (nid, number), (state, error_kind, error_detail, message_id), updated_at, what)
        if (lease_until is not None) != (state == AttemptState.IN_FLIGHT):
            found.append(Violation("record_matches", f"{what} is {state} with lease {lease_until}: only a call in flight holds one"))
        if state in REPORTED and status_at is None:
            found.append(Violation("record_matches", f"{what} is {state} without the time of its status"))
        if channels.get(route) != channel:
            found.append(Violation("record_matches", f"{what}: channel {channel} is not its route's ({route})"))
        if min(tries, runs, claims) < 0 or as_time(updated_at) < as_time(created_at):
            found.append(Violation("record_matches", f"{what}: counts or times out of range"))
        if state == AttemptState.IN_FLIGHT and None in (inbox_id, contact_id, conversation_id, lease_until, in_flight_since):
            found.append(Violation("record_matches", f"{what} is in flight without its target or lease"))
        if state in (AttemptState.QUEUED, AttemptState.IN_FLIGHT, AttemptState.UNKNOWN) and message_id is not None:
            found.append(Violation("record_matches", f"{what} is {state} with a message"))
        if error_kind == CANCELLED:
            cancelled_attempts.add(nid)
        if message_id is None:
            continue
        messages_of[nid].add(message_id)
        channel_of_message[message_id] = channel
        message = by_id.get(message_id)
        if message is None or accepted_at is None:
            found.append(Violation("record_matches", f"{what} names a message the workspace does not have, or no acceptance time"))
            continue
        conversation = conversations.get(message.conversation_id)
        match = EVENT_IN_CONTENT.match(message.content or "")
        if (message.inbox_id != inbox_id or inbox_id != ROUTE_INBOX.get(route) or conversation is None
                or conversation.display_id != conversation_id or conversation.contact_id != contact_id
                or match is None or match.group(1) != event_of.get(nid)):
            found.append(Violation("record_matches", f"{what}: message {message_id} is not where the attempt says"))
    reasons: dict[int, str] = world.memory.setdefault("fallback_reasons", {})
    decision_times: dict[int, str] = world.memory.setdefault("fallback_decided_at", {})
    scheduled = world.raw.execute("SELECT id, send_at FROM notifications WHERE state = ?", (NotificationState.SCHEDULED,))
    for nid, send_at in scheduled:  # a scheduled notification waits for the time its host asked for, no other's
        asked = world.asked_send_at.get(str(event_of.get(nid)), set())
        if asked and not any(abs((as_time(send_at) - time).total_seconds()) < 0.001 for time in asked):
            found.append(Violation("record_matches", f"{event_of.get(nid)} is scheduled for a time its host never asked for"))
    for (nid, state, current, message_id, inbox_id, conversation_id, channel, accepted_at, decision, reason, decided_at,
         error_kind, error_detail, created_at, updated_at, delivery_state) in world.raw.execute(
            "SELECT id, state, current_attempt, message_id, inbox_id, conversation_id, channel, accepted_at, "
            "fallback_decision, fallback_reason, fallback_decided_at, error_kind, error_detail, created_at, updated_at, "
            "delivery_state FROM notifications"):
        what = str(event_of.get(nid))
        if (nid in cancelled_attempts) != (state == NotificationState.CANCELLED):
            found.append(Violation("record_matches", f"{what} is {state}, and "
                                   + ("an attempt of it was cancelled" if nid in cancelled_attempts else "no attempt was")))
        if reason is not None and reasons.setdefault(nid, reason) != reason:
            found.append(Violation("one_fallback", f"{what}: the fallback decision's reason '{reasons[nid]}' became '{reason}'"))
        if decided_at is not None and decision_times.setdefault(nid, decided_at) != decided_at:
            found.append(Violation("one_fallback", f"{what}: the fallback decision, made once, was given another time"))
        if (state == NotificationState.QUEUED and message_id is None and inbox_id is not None
                and inbox_id != inbox_of_attempt.get((nid, current))):
            # queued with no message to show (a first attempt, a host's retry), the record describes
            # its current attempt: where its call goes once claimed, nowhere before
            found.append(Violation("record_matches", f"{what} shows inbox {inbox_id} with no message, not its "
                                   "current attempt's"))
        moved("n", (nid, 0), (state, error_kind, error_detail, message_id, decision, delivery_state), updated_at, what)
        if state in ENDED_BY_DELIVERY and delivery_state != state:
            found.append(Violation("record_matches", f"{what} ended {state} showing delivery state {delivery_state}"))
        if as_time(updated_at) < as_time(created_at) or (current is not None and current < 1):
            found.append(Violation("record_matches", f"{what}: times or current attempt out of range"))
        if (decision is None) != (decided_at is None) or (decision is not None and not reason):
            found.append(Violation("record_matches", f"{what}: fallback decision {decision} without its reason or time"))
        if state == NotificationState.FAILED and decision is None:
            # a failed notification failed its first attempt (or a later one, after the decision):
            # the failure that ends it is the decision's, never written beside it
            found.append(Violation("record_matches", f"{what} failed without a fallback decision"))
        if (reason or "").startswith("window_closed_no_template") and world.requests[int(what.split("-")[1])].template:
            found.append(Violation("template_resend", f"{what}: fell back after a 131047 though its request carries "
                                   "an approved template (it is resent as that template, on the same route)"))
        if message_id is None:
            continue
        message = by_id.get(message_id)
        if message_id not in messages_of.get(nid, ()) or message is None or accepted_at is None:
            found.append(Violation("record_matches", f"{what}: message {message_id} is none of its attempts'"))
        elif (message.inbox_id != inbox_id or conversations[message.conversation_id].display_id != conversation_id
              or channel != channel_of_message.get(message_id)):
            found.append(Violation("record_matches", f"{what}: message {message_id} is not where the notification says"))
    return found


# Ended: no send can follow. Delivered too: its attempt reached the person, nothing more goes.
NO_MORE_SENDS = frozenset({NotificationState.READ, NotificationState.DELIVERED, NotificationState.FAILED,
                           NotificationState.CANCELLED})
ACCEPTED_STATES = frozenset({NotificationState.ACCEPTED, NotificationState.SENT})


def _free_text_in_window(world: World, messages: list) -> list[Violation]:
    """``free_text_in_window``: on the platform, free text goes while the customer-service window is
    open; a template only where the route requires one or the window has closed
    (dispatcher/policy/channels.py, docs/notifications.md "Send", step 3). Judged for the recipients
    whose window the world set (kinds 6 and 7: it closes as the reminder goes), by the workspace's
    clock, and only where the run that made the message could know the window was open: the store
    held it before the run began (the product reads it from the customer's webhook; not knowing, it
    sends the template, as it should)."""
    if not world.window_closes_at or world.settings.routes["reminders"].template_required:
        return []
    inbox = ROUTE_INBOX["reminders"]
    known: dict[int, float] = world.memory.setdefault("window_known_at", {})  # contact -> when the store first held its window
    for (contact_id,) in world.raw.execute("SELECT contact_id FROM service_windows WHERE inbox_id = ?", (inbox,)):
        known.setdefault(contact_id, world.clock.now)
    found = []
    for message in messages:
        if message.template_params is None or message.inbox_id != inbox:
            continue
        match = EVENT_IN_CONTENT.match(message.content or "")
        closes_at = world.window_closes_at.get(int(match.group(1).split("-")[1])) if match else None
        began = world.create_runs.get(message.created_at)
        # Judged only where the run that made it could know the window: the store held it (from the
        # customer's message_created webhook) before the run began; else, in doubt, a template is right.
        if (closes_at is not None and message.created_at < closes_at and began is not None
                and known.get(message.contact_id, float("inf")) <= began.timestamp()):
            found.append(Violation("free_text_in_window", f"{match.group(1) if match else '?'}: message {message.id} "
                                   f"went as a template {closes_at - message.created_at:.3f} s before the window closed"))
    return found


def _content_goes(world: World) -> list[Violation]:
    """``content_goes``: a notification's content and contact details (its payloads row) are
    deleted in the step that makes any further send impossible (docs/notifications.md, "What is
    kept"): once it is delivered, read, failed or cancelled, and once an attempt no other can
    follow was accepted (the fallback's, a retry's, or one with no fallback route whose request
    carries no template to resend)."""
    found = []
    for event_id, state, fallback_route, purpose in world.raw.execute(
            "SELECT n.event_id, n.state, n.fallback_route, a.purpose FROM notifications n "
            "JOIN payloads p ON p.notification_id = n.id "
            "LEFT JOIN attempts a ON a.notification_id = n.id AND a.number = n.current_attempt"):
        request = world.requests[int(event_id.split("-")[1])]
        last_possible = purpose in ("fallback", "retry") or (fallback_route is None and request.template is None)
        if state in NO_MORE_SENDS or (state in ACCEPTED_STATES and last_possible):
            found.append(Violation("content_goes", f"{event_id} is {state} and still holds its content"))
    return found


def at_end(world: World) -> list[Violation]:
    found = _every_message_known(world) + _callbacks_in_order(world)
    suppressed = {(key, channel) for key, channel in world.raw.execute("SELECT recipient_key, channel FROM suppressions")}
    keys_of = _recipient_keys(world)
    for index, channel in sorted(world.stops_recorded):
        if not any((key, scope) in suppressed for key in keys_of[f"ev-{index}"] for scope in (channel, "*")):
            found.append(Violation("stop_honoured", f"the recipient of ev-{index} replied STOP and is not suppressed on {channel}"))
    return found


def _callbacks_in_order(world: World) -> list[Violation]:
    """Each notification's callbacks are numbered 1, 2, ... with none missing, and within an attempt
    their states only move forward (the host may order them by sequence)."""
    found = []
    told: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for event_id, sequence, attempt, state in world.raw.execute(
            "SELECT event_id, sequence, attempt, state FROM callbacks ORDER BY event_id, sequence"):
        told[event_id].append((sequence, attempt, state))
    order = {state: rank for rank, state in enumerate(EVENT_OF_STATE)}
    for event_id, events in told.items():
        if [sequence for sequence, _, _ in events] != list(range(1, len(events) + 1)):
            found.append(Violation("host_told", f"{event_id}: callbacks numbered {[s for s, _, _ in events]}"))
        for (_, attempt, state), (_, next_attempt, next_state) in zip(events, events[1:], strict=False):
            if next_attempt == attempt and order[next_state] <= order[state] and state != NotificationState.FALLING_BACK:
                found.append(Violation("host_told", f"{event_id}: told {next_state} after {state} on attempt {attempt}"))
    return found


def _every_message_known(world: World) -> list[Violation]:
    found = []
    recorded: dict[tuple[str, int], set[int]] = defaultdict(set)
    unknown: set[tuple[str, int]] = set()
    for event_id, route, message_id, error_kind in world.raw.execute(
            "SELECT n.event_id, a.route, a.message_id, a.error_kind FROM attempts a "
            "JOIN notifications n ON n.id = a.notification_id"):
        inbox = ROUTE_INBOX.get(route, 0)
        if message_id is not None:
            recorded[(event_id, inbox)].add(message_id)
        if error_kind == "outcome_unknown":
            unknown.add((event_id, inbox))
    for message in world.workspace.outgoing():
        match = EVENT_IN_CONTENT.match(message.content or "")
        if match is None:
            continue
        key = (match.group(1), message.inbox_id)
        if message.id not in recorded[key] and key not in unknown:
            found.append(Violation("message_known", f"{key[0]}: message {message.id} in inbox {key[1]} is no attempt's"))
    return found


# error_kind -> the fault one of the notification's send tasks must have met for it to be true
REASON_NEEDS_FAULT = {"rejected": "422", "not_found": "404"}


# The providers' words for "this person opted out" (docs/opt-outs.md): a notification whose last
# message failed with one of them ends opted_out, not external_error.
PROVIDER_OPT_OUT_CODES = ("21610", "131050")


def _true_reasons(world: World, messages: list, event_of: dict[int, str]) -> list[Violation]:
    found: list[Violation] = []
    said_no = (set(world.opted_out_at) | {index for index, _channel in world.stop_messages.values()}  # asked, at least
               | world.provider_opted_out)
    last_failure: dict[str, str] = {}  # event ID -> its latest failed message's error (messages in ID order)
    for m in sorted(messages, key=lambda m: m.id):
        if m.status == "failed" and (match := EVENT_IN_CONTENT.match(m.content or "")) is not None:
            last_failure[match.group(1)] = m.external_error or ""
    failed_events = set(last_failure)  # events with a failed message
    met = world.memory.get("met", {})
    max_runs = world.settings.send_max_runs
    rows = world.raw.execute(
        "SELECT n.id, n.event_id, n.error_kind, a.error_kind, a.runs, a.number = n.current_attempt, n.state "
        "FROM notifications n LEFT JOIN attempts a ON a.notification_id = n.id")
    judged: set[int] = set()  # the notification's own reason is judged once (the rows are one per attempt)
    for nid, event_id, notification_kind, attempt_kind, runs, current, state in rows:
        index = int(event_id.split("-")[1])
        first_row = nid not in judged
        judged.add(nid)
        if (first_row and state == NotificationState.FAILED and notification_kind == "external_error"
                and last_failure.get(event_id, "").startswith(PROVIDER_OPT_OUT_CODES)):
            found.append(Violation("true_reason", f"{event_id}: failed external_error, but its last message failed "
                                   "because the recipient opted out with the provider (opted_out)"))
        for side, kind in (("notification", notification_kind), ("attempt", attempt_kind)):
            if kind is None:
                continue
            why = None
            if kind not in documented_error_kinds():
                why = "docs/notifications.md does not name it (Error kinds)"
            elif kind in ("opted_out", "no_consent") and (kind == "no_consent" or index not in said_no):
                why = "its recipient never said no"
            elif kind in REASON_NEEDS_FAULT and REASON_NEEDS_FAULT[kind] not in met.get(nid, ()):
                why = f"no call of its was answered {REASON_NEEDS_FAULT[kind]}"
            elif kind == "cancelled" and event_id not in world.cancels_asked:
                why = "the host never cancelled it"
            elif kind == "external_error" and event_id not in failed_events:
                why = "no message of its failed"
            elif kind == CRASH_LOOP and side == "notification" and current and runs <= max_runs:
                why = f"its attempt counts {runs} runs (set aside past {max_runs})"
            if why is not None:
                found.append(Violation("true_reason", f"{event_id}: {side} error_kind {kind}, but {why}"))
    return found


SEND_OUTCOMES = frozenset(outcome.value for outcome in Outcome)
OUTCOME_SPAN_ATTRIBUTES = frozenset({"dispatcher.notification_id", "dispatcher.attempt", "dispatcher.message_id",
                                     "dispatcher.state", "dispatcher.status"})


def _traced(world: World) -> list[Violation]:
    """With tracing on (docs/tracing.md): each outcome applied is a span in its notification's own
    trace, saying which attempt, message, state and status; and an outcome the consumer says it
    applied (``applied_<state>``) has its span."""
    if world.spans is None:
        return []
    found: list[Violation] = []
    marked: set[tuple[object, object]] = world.memory.setdefault("marked", set())
    new_spans = [span for span in world.spans.get_finished_spans() if span.name in ("dispatcher.outcome", "dispatcher.send")]
    world.spans.clear()
    if new_spans:
        trace_of = {nid: int(parent.split("-")[1], 16) for nid, parent in world.raw.execute(
            "SELECT id, trace_parent FROM notifications WHERE trace_parent IS NOT NULL")}
        for span in new_spans:
            attributes = dict(span.attributes or {})
            nid = attributes.get("dispatcher.notification_id")
            if trace_of.get(nid) != span.context.trace_id:
                found.append(Violation("traced", f"a {span.name} span of n{nid} is outside the notification's trace"))
            if span.name == "dispatcher.send":
                # a run that ended (not one a crash cut short) says how, for its workspace
                if span.status.is_ok and (attributes.get("dispatcher.outcome") not in SEND_OUTCOMES
                                          or attributes.get("dispatcher.workspace") != world.settings.workspace_name):
                    found.append(Violation("traced", f"a send span of n{nid} says {attributes}"))
                continue
            missing = OUTCOME_SPAN_ATTRIBUTES - set(attributes)
            if missing:
                found.append(Violation("traced", f"an outcome span of n{nid} lacks {', '.join(sorted(missing))}"))
            marked.add((attributes.get("dispatcher.message_id"), attributes.get("dispatcher.state")))
    for what in world.said:
        if what.who == "consumer" and what.word.startswith("applied_"):
            state = what.word.removeprefix("applied_")
            if (what.message_id, state) not in marked:
                found.append(Violation("traced", f"the consumer applied {state} to message {what.message_id}, "
                                       "and no span says so"))
    return found


def _outcome_words(world: World) -> list[Violation]:
    """``outcome_word``: each word a run ended with is one docs/tracking.md lists ("Outcome
    words"), and a delivery's word agrees with the store: ``applied_<state>`` only once its attempt
    holds that state or a later one, ``fallback`` and ``no_fallback`` only with that decision
    written, ``fallback_failed`` only for a failed notification (``owed_`` words alike); a report
    that names a message is never ``ignored``."""
    found = []
    said, world.said = world.said, []
    words = documented_outcome_words()
    for what in said:
        word = what.word.removeprefix("owed_")
        if word not in words or word.startswith("owed_"):
            found.append(Violation("outcome_word", f"the {what.who} said {what.word!r}: docs/tracking.md does not list it"))
            continue
        if what.message_id is None:
            continue
        if what.who == "consumer" and word == "ignored":  # said of other events, or of a notification gone
            found.append(Violation("outcome_word", f"the consumer ignored the report of message {what.message_id}"))
            continue
        if what.who == "consumer" and word in ("no_status", "opted_in"):
            found += _what_the_workspace_holds(world, what)
            continue
        if not (word.startswith("applied_") or word in WORD_NEEDS):
            continue
        row = world.raw.execute(
            "SELECT a.state, n.state, n.fallback_decision, n.event_id FROM attempts a "
            "JOIN notifications n ON n.id = a.notification_id WHERE a.message_id = ?", (what.message_id,)).fetchone()
        if row is None:
            found.append(Violation("outcome_word", f"the {what.who} said {what.word!r} of message {what.message_id}, "
                                   "which no attempt names"))
            continue
        attempt_state, state, decision, event_id = row
        if word.startswith("applied_"):
            holds = rank(AttemptState(attempt_state)) >= rank(AttemptState(word.removeprefix("applied_")))
        else:
            column, wanted = WORD_NEEDS[word]
            holds = (state if column == "state" else decision) == wanted
        if not holds:
            found.append(Violation("outcome_word", f"{event_id}: the {what.who} said {what.word!r} while its attempt is "
                                   f"{attempt_state}, the notification {state}, decision {decision}"))
    return found


def _what_the_workspace_holds(world: World, what: Said) -> list[Violation]:
    """``no_status`` only when the read found no status for the message (a stock message has one
    from its creation: the word then means the read did not apply it); ``opted_in`` never for a
    STOP reply (the recipients of these worlds only ever say STOP)."""
    if what.word == "opted_in":
        if what.message_id in world.stop_messages:
            return [Violation("outcome_word", f"the consumer said 'opted_in' of STOP reply m{what.message_id}")]
        return []
    for message in world.workspace.outgoing():
        if message.id == what.message_id and message.status is not None:
            return [Violation("outcome_word", f"the consumer said 'no_status' of message {message.id}, which the "
                              f"workspace holds as {message.status}")]
    return []


# What a delivery's word says of its notification: (column, value).
WORD_NEEDS = {"fallback": ("decision", "fallback"), "no_fallback": ("decision", "none"),
              "fallback_failed": ("state", "failed")}


def _docs_section(name: str, heading: str) -> str:
    """One section of a page of docs/, from its heading to the next: the tables the checks read."""
    text = (Path(__file__).resolve().parents[2] / "docs" / name).read_text()
    section = text[text.index(heading):]
    end = section.find("\n## ", 1)
    return section if end < 0 else section[:end]


@cache
def documented_fallbacks() -> dict[str, bool]:
    """Whether a first attempt's failure of each kind falls back, as docs/notifications.md's
    "Error kinds" table says ("yes"; "no", or "waits; no, when it fails"); kinds whose answer
    depends on more (a provider's code) or that never end an attempt are left out."""
    table = _docs_section("notifications.md", "## Error kinds")
    found = {}
    for kind, falls_back in re.findall(r"^\| `([a-z_]+)` \|[^|]*\|[^|]*\| ([^|]*) \|", table, flags=re.MULTILINE):
        if falls_back.startswith("yes"):
            found[kind] = True
        elif falls_back.startswith("no") or "no, when it fails" in falls_back:
            found[kind] = False
    return found


@cache
def documented_outcome_words() -> frozenset[str]:
    """The words of docs/tracking.md's "Outcome words" table (``owed_<word>`` stands for an owed
    decision's word): read, not copied."""
    table = _docs_section("tracking.md", "## Outcome words")
    first_cells = re.findall(r"^\| ([^|]+) \|", table, flags=re.MULTILINE)
    return frozenset(word for cell in first_cells for word in re.findall(r"`([a-z_]+)`", cell))


@cache
def documented_error_kinds() -> frozenset[str]:
    """The kinds a user may see, as docs/notifications.md lists them (its "Error kinds" table):
    read, not copied, so a kind the code writes under another name is caught."""
    table = _docs_section("notifications.md", "## Error kinds")
    return frozenset(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE))


PRIVATE_IN_LOGS = re.compile(r"\+?1555\d{7}|Reminder ev-|appointment is tomorrow|sandbox-token")
# Errors no fault of the world raises: only a bug in our code does. The consumer keeps a failed
# delivery's error on its row and logs its kind, and the tracking sweep hands the delivery over
# again, so such a bug costs no promise (a read-back learns the outcome): it is seen here instead.
PROGRAMMING_ERRORS = frozenset({"TypeError", "AttributeError", "NameError", "UnboundLocalError", "AssertionError",
                                "IndexError", "KeyError", "ZeroDivisionError", "RecursionError"})


def _arguments(record: logging.LogRecord) -> tuple[object, ...]:
    args = record.args
    return tuple(args.values()) if isinstance(args, dict) else tuple(args or ())


def _logs(world: World) -> list[Violation]:
    found = []
    for record in world.logged:
        try:
            line = record.getMessage()
        except (TypeError, ValueError) as error:
            found.append(Violation("logs_private", f"{record.name}:{record.lineno} does not format: {type(error).__name__}"))
            continue
        if not isinstance(record.msg, str) or not record.msg.strip() or None in _arguments(record):
            found.append(Violation("logs_private", f"{record.name}:{record.lineno} says nothing, or None"))
            continue
        if PRIVATE_IN_LOGS.search(line):
            found.append(Violation("logs_private", f"{record.name}:{record.lineno} logs private data"))
        if bugs := PROGRAMMING_ERRORS.intersection(str(argument) for argument in _arguments(record)):
            found.append(Violation("bug_raised", f"{record.name}:{record.lineno} kept a {min(bugs)} and went on"))
    world.logged.clear()
    return found
