"""Apply delivery outcomes monotonically, and make the single fallback decision.

An outcome (from a webhook, or read back from the message list) moves an attempt's state only
forward: sent < delivered < read, failed ends it. Each (message ID, status) is applied once,
whatever delivery ID it came under. When the first attempt fails, or is not delivered by its
route's deadline, one decision is stored with a compare-and-set on ``fallback_decision IS NULL``:
fall back to the fallback route, or not, with the reason. However many consumers see however
many copies of the failure, only one decision exists, and only the winner enqueues the fallback.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from dispatcher import metrics, tracing
from dispatcher.api import ApiError
from dispatcher.context import READS_BUCKET, SendContext, Wait, call_api, readback_plan_of
from dispatcher.enqueue import Enqueuer
from dispatcher.intake.request import SendPayload
from dispatcher.lifecycle import moves, worklists
from dispatcher.lifecycle.states import (
    AFTER_DECISION_PURPOSES,
    AttemptPurpose,
    AttemptState,
    advance,
    attempt_state_from_status,
)
from dispatcher.policy.channels import reports_read
from dispatcher.policy.fallback import EXTERNAL_ERROR, Choice, Facts, Failure, FallbackRules, Next, choose
from dispatcher.policy.readback import UNCONFIRMED_STATES, next_read_at
from dispatcher.queues import Priority, send_queue
from dispatcher.recipients import keywords, platform
from dispatcher.recipients.keys import keys_of_contact
from dispatcher.settings import Route
from dispatcher.store import queries as store
from dispatcher.store import suppressions
from dispatcher.store.models import Attempt, Notification
from dispatcher.tracking.webhooks.events import EventSummary, redacted_error

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Outcome:
    message_id: int
    status: str | None
    external_error: str | None
    # The keyed digest of the update that brought it, when that update reports no failure
    # (EventSummary.clean_update): a second, different one tells the message moved past sent.
    update_digest: str | None = None


def fallback_rules(ctx: SendContext) -> FallbackRules:
    settings = ctx.settings
    return FallbackRules(
        fallback_codes=frozenset(settings.fallback_codes),
        no_fallback_codes=frozenset(settings.no_fallback_codes),
        unknown_falls_back=settings.unknown_error_falls_back,
    )


MarkProcessed = Callable[[Session, str], None]


def apply_event(summary: EventSummary, ctx: SendContext, enqueuer: Enqueuer, *, received_at: datetime | None = None,
                mark_processed: MarkProcessed | None = None) -> str:
    """Apply one webhook event summary; return what happened, as a short word for the record.

    An event without a status (a stock workspace's, for a message that is not its conversation's
    latest) costs a read of the message list: the first one of a message at once, so that a late
    ``sent`` has the least time to overwrite what it announces; one after a read waits until
    ``status_read_wait_s`` after that read, so one read answers the burst (raises :class:`Wait`),
    and none when a read begun after it was received already told what it announces. One read
    answers every message of ours on the page it returns. Whatever the status read, an update that
    reports no failure is weighed as evidence: two distinct ones mean the message moved past
    ``sent`` (docs/tracking.md, "A status the workspace overwrote").
    ``mark_processed``: called inside the transaction that applies the event's own delivery
    state (not a failure, whose decision follows in transactions of its own), so the delivery
    is marked done with it.
    """
    event = summary.event
    if event == "message_created" and summary.message_type == "incoming":
        opened = open_window(summary, ctx)
        return apply_reply(summary, ctx) or opened
    if event not in ("message_created", "message_updated") or summary.message_id is None:
        return "ignored"
    message_id = summary.message_id
    if summary.status is not None:  # the contract's shapes, or a stock event about its conversation's latest message
        return apply_outcome(Outcome(message_id, summary.status, summary.external_error, summary.clean_update), ctx,
                             enqueuer, mark_processed=mark_processed)
    with ctx.sessions() as session:
        attempt = store.attempt_by_message(session, ctx.settings.workspace_name, message_id)
    if attempt is None:
        return "ignored_not_ours"
    # No status in the event: what can be learned without a read, else a read.
    if event == "message_created":
        return "ignored_no_status"  # our own message announced: nothing new to learn
    state = AttemptState(attempt.state)
    if state in (AttemptState.READ, AttemptState.FAILED) or (
            state is AttemptState.DELIVERED and not reports_read(attempt.channel)):
        return "settled"  # nothing later can be learned
    evidence = Outcome(message_id, None, None, summary.clean_update)
    if received_at is not None and attempt.last_read_at is not None and attempt.last_read_at >= received_at:
        # a read begun after this event arrived already applied its news
        return _weigh(evidence, ctx, enqueuer, word="known_from_read")
    if attempt.last_read_at is not None:
        wait_s = ctx.settings.status_read_wait_s - (ctx.clock() - attempt.last_read_at).total_seconds()
        if wait_s > 0:
            raise Wait(wait_s, "one read of the conversation answers the updates after its last read")
    # Stock releases send no status: read it, from OUR stored conversation, never the payload's.
    found = read_outcomes(ctx, conversation_id=attempt.conversation_id, message_id=message_id)
    mine = found.pop(message_id, None)
    for other in found.values():  # the same read answers our other messages on the page
        apply_outcome(other, ctx, enqueuer)
    if mine is None or mine.status is None:
        return _weigh(evidence, ctx, enqueuer, word="no_status")
    return apply_outcome(dataclasses.replace(mine, update_digest=summary.clean_update), ctx, enqueuer,
                         mark_processed=mark_processed)


def _weigh(evidence: Outcome, ctx: SendContext, enqueuer: Enqueuer, *, word: str) -> str:
    """An update with no status of its own to apply: weigh it as evidence (see :func:`apply_in`);
    ``word`` unless it shows the message moved past sent."""
    if evidence.update_digest is None:
        return word
    weighed = apply_outcome(evidence, ctx, enqueuer)
    return weighed if weighed == DELIVERED_BY_EVENTS else word


def open_window(summary: EventSummary, ctx: SendContext) -> str:
    """An incoming customer message opens the 24-hour customer-service window for the pair.

    The window opens at the message's own time, never later than now: a sender's clock ahead of
    ours must not stretch the window past 24 hours.
    """
    if summary.contact_id is None or summary.inbox_id is None:
        return "ignored_incoming_without_ids"
    now = ctx.clock()
    at = min(summary.created_at, now) if summary.created_at is not None else now
    with ctx.sessions.begin() as session:
        store.open_service_window(
            session, account=ctx.settings.account, contact_id=summary.contact_id, inbox_id=summary.inbox_id, at=at
        )
    return "window_opened"


def apply_reply(summary: EventSummary, ctx: SendContext) -> str | None:
    """An incoming reply that is, whole, an opt-out keyword of the route it came in on suppresses
    its sender on that route's channel, for every category; an opt-in keyword lifts what replies
    and the provider recorded there. None: not a keyword reply of any route's inbox."""
    if summary.reply_keyword is None or summary.inbox_id is None:
        return None
    routes = [route for route in ctx.settings.routes.values() if _inbox_of(route, ctx) == summary.inbox_id]
    intents = {(intent, route.channel.value) for route in routes
               if (intent := keywords.reply_intent(summary.reply_keyword, route)) is not None}
    if not intents:
        return "ignored_reply"
    now, account = ctx.clock(), ctx.settings.account
    with ctx.sessions.begin() as session:
        keys = set(summary.sender_keys)
        if summary.contact_id is not None:
            keys.update(suppressions.keys_of_workspace_contact(session, account=account,
                                                               contact_id=summary.contact_id))
        if not keys:
            # A keyword we cannot tie to anyone: said, not silently dropped (the operator can act on it).
            log.warning("an opt-out/opt-in reply on inbox %s names no sender we know; not recorded", summary.inbox_id)
            metrics.OPT_OUTS.labels(change="unmatched", source="keyword").inc()
            return "ignored_reply_unknown_sender"
        for intent, channel in sorted(intents):
            if intent == "opt_out":
                suppressions.suppress(session, account=account, keys=sorted(keys),
                                      scope=suppressions.Scope(channel=channel), reason=suppressions.Reason.KEYWORD, now=now)
            else:
                suppressions.lift_channel(session, account=account, keys=sorted(keys), channel=channel,
                                          reason=suppressions.Reason.KEYWORD, now=now)
    change = "opted_out" if any(intent == "opt_out" for intent, _ in intents) else "opted_in"
    metrics.OPT_OUTS.labels(change=change, source="keyword").inc()
    log.info("a reply keyword on inbox %s: recipient %s", summary.inbox_id, change.replace("_", " "))
    return change


def _inbox_of(route: Route, ctx: SendContext) -> int | None:
    """The route's inbox ID. An inbox list that cannot be read now raises (ApiError): the delivery
    is tried again, as for any failed read, rather than a STOP on a route named by its inbox being
    taken for an ordinary reply and dropped (the opt-outs simulation world, seed 254)."""
    if route.inbox_id is not None:
        return route.inbox_id
    inbox = ctx.inboxes.resolve(route)
    return inbox.id if inbox is not None else None


def record_platform_opt_out(notification_id: int, external_error: str | None, ctx: SendContext) -> bool:
    """A provider code that means "this person opted out" (21610, 131050): suppress the recipient
    of the notification's current attempt in that code's scope. Whether it was such a code."""
    if not platform.means_opt_out(external_error):
        return False  # the usual failure: no transaction spent on this question
    now, account = ctx.clock(), ctx.settings.account
    with ctx.sessions.begin() as session:
        notification = session.get(Notification, notification_id)
        if notification is None:
            return False
        attempt = store.attempt_numbered(session, notification_id, notification.current_attempt)
        scope = platform.opt_out_scope(external_error, channel=attempt.channel if attempt else notification.channel or "")
        if scope is None:
            return False
        keys = set()
        if attempt is not None and attempt.contact_id is not None:
            keys.update(suppressions.keys_of_workspace_contact(session, account=account,
                                                               contact_id=attempt.contact_id))
        body = store.load_payload(session, notification_id)
        if body is not None:
            try:
                keys.update(keys_of_contact(SendPayload.model_validate(body).contact, key=ctx.settings.hashing_key))
            except ValidationError:
                pass
        suppressions.suppress(session, account=account, keys=sorted(keys), scope=scope,
                              reason=suppressions.Reason.PLATFORM, now=now)
    metrics.OPT_OUTS.labels(change="opted_out", source="platform").inc()
    log.info("notification %s: the provider says its recipient opted out (%s)", notification_id, scope.describe())
    return True


def read_outcomes(ctx: SendContext, *, conversation_id: int | None, message_id: int) -> dict[int, Outcome]:
    """A read of the message list of a (stored) conversation: the news it holds for each of our
    messages on the page (``message_id``'s always, when listed; the others' only where it is
    later than what we know). Notes the read on every one of those attempts.

    The latest page first, so that one read answers every recent message of the conversation (a
    patient's reminders often go out together); a message older than that page costs a second
    read, of the page that ends with it."""
    return read_page(ctx, conversation_id=conversation_id, message_id=message_id)[0]


def read_page(ctx: SendContext, *, conversation_id: int | None, message_id: int,
              past_latest: bool = False) -> tuple[dict[int, Outcome], set[int]]:
    """:func:`read_outcomes`, and the IDs of every message the read listed. ``past_latest``: the
    caller has just read the latest page without the message, so only the page ending with it is read."""
    if conversation_id is None:
        return {}, set()
    began = ctx.clock()
    page = None if past_latest else call_api(ctx, lambda: ctx.api.list_messages(conversation_id), READS_BUCKET)
    if page is None or all(message.id != message_id for message in page.messages):
        page = call_api(ctx, lambda: ctx.api.list_messages(conversation_id, before=message_id + 1), READS_BUCKET)
    listed = {message.id: message for message in page.messages}
    with ctx.sessions.begin() as session:
        ours = store.note_read(session, ctx.settings.workspace_name, list(listed), at=began)
    found: dict[int, Outcome] = {}
    for listed_id, (_, state) in ours.items():
        message = listed[listed_id]
        status = message.status.value if message.status is not None else None
        news = status is not None and advance(AttemptState(state), attempt_state_from_status(status)) != state
        if listed_id == message_id or news:
            found[listed_id] = Outcome(listed_id, status, message.external_error)
    return found, set(listed)


@dataclass(frozen=True)
class FailedAttempt:
    """A failure an outcome recorded: its decision follows, outside the recording transaction."""

    notification_id: int
    purpose: AttemptPurpose
    external_error: str | None  # redacted


@dataclass(frozen=True)
class Applied:
    """What one outcome did inside its transaction: its word, and the failure it recorded, if any."""

    word: str
    failed: FailedAttempt | None = None


def apply_outcome(outcome: Outcome, ctx: SendContext, enqueuer: Enqueuer | None, *,
                  mark_processed: MarkProcessed | None = None) -> str:
    """Move the attempt forward (never back), once per (message, status); decide on a failure.
    A failure applied before whose decision is still owed (the run that applied it died before
    deciding) gets it now. ``mark_processed``: see :func:`apply_event`."""
    with ctx.sessions.begin() as session:
        group = read_group(session, [outcome], ctx)  # a group of one: the same statements, one path
        applied = apply_in(session, outcome, ctx, group, mark_processed=mark_processed)
        finish_group(session, group, ctx)
    observe_deliveries(group)
    return follow_up(outcome, applied, ctx, enqueuer)


def follow_up(outcome: Outcome, applied: Applied, ctx: SendContext, enqueuer: Enqueuer | None) -> str:
    """What follows an outcome's transaction, once it committed: a recorded failure's decision, or
    the decision a failure reported again still owes. The outcome's final word."""
    if applied.failed is not None:
        failed = applied.failed
        return settle_failure(failed.notification_id, Failure(purpose=failed.purpose, error_kind=EXTERNAL_ERROR,
                                                              detail=failed.external_error), ctx, enqueuer)
    if applied.word != "duplicate_status" or attempt_state_from_status(outcome.status) is not AttemptState.FAILED:
        return applied.word
    with ctx.sessions() as session:
        attempt = store.attempt_by_message(session, ctx.settings.workspace_name, outcome.message_id)
        notification_id = attempt.notification_id if attempt is not None else None
    owed = finish_owed_decision(notification_id, ctx, enqueuer) if notification_id is not None else None
    return applied.word if owed is None else f"owed_{owed}"


@dataclass
class GroupRead:
    """What the outcomes applied in one transaction (:func:`read_group`; one outcome alone is a
    group of one) read and record first (one statement on PostgreSQL), before they are weighed one
    by one with :func:`apply_in`; their moves and payload drops wait for :func:`finish_group`, one
    statement per kind of change, instead of statements for each outcome."""

    attempts: dict[int, store.OutcomeAttempt]  # by message ID; kept as this transaction moved them
    new_statuses: set[tuple[int, str]]  # (message, status) recorded now: the first outcome to claim one applies it
    moves: list[moves.OutcomeMove] = field(default_factory=list)  # the attempts' moves, recorded at the end
    drops: list[tuple[int, int]] = field(default_factory=list)  # (notification, attempt number), at the end
    # (route, seconds from acceptance) of each message this group first moved to delivered or read:
    # told to the metrics once the transaction committed (observe_deliveries)
    delivered: list[tuple[str, float]] = field(default_factory=list)


def read_group(session: Session, outcomes: Sequence[Outcome], ctx: SendContext) -> GroupRead:
    """Lock and read the attempts of ``outcomes``' messages (in message order, on PostgreSQL), and
    record the applied statuses of those that are ours: one statement on PostgreSQL, two on SQLite."""
    attempts, new_statuses = store.lock_attempts_and_record_statuses(
        session, ctx.settings.workspace_name, [outcome.message_id for outcome in outcomes],
        [(outcome.message_id, outcome.status) for outcome in outcomes if outcome.status is not None])
    return GroupRead(attempts, new_statuses)


def observe_deliveries(group: GroupRead) -> None:
    """After the group's transaction committed: each message it first found delivered or read, in
    the delivery latency by route (from what the group read anyway: no statement of its own)."""
    for route, seconds in group.delivered:
        metrics.DELIVERY_LATENCY.labels(route=route).observe(seconds)
    group.delivered.clear()


def finish_group(session: Session, group: GroupRead, ctx: SendContext) -> None:
    """What the group's outcomes left to the end of their transaction: their moves, one statement
    per kind of change (:func:`moves.record_outcomes`), then the payloads to drop, in one go."""
    moves.record_outcomes(session, group.moves, now=ctx.clock())
    group.moves.clear()
    store.drop_payloads_of_current(session, group.drops)
    group.drops.clear()


# The word of an outcome inferred from the events: two distinct updates without a failure, while
# the message list says sent (a late ``sent`` overwrote the delivery the workspace had reported).
DELIVERED_BY_EVENTS = "delivered_by_events"


def apply_in(session: Session, outcome: Outcome, ctx: SendContext, group: GroupRead, *,
             mark_processed: MarkProcessed | None = None) -> Applied:
    """The part of :func:`apply_outcome` inside the caller's transaction (the consumer applies many
    outcomes in one): the move, and the applied status and the attempt that :func:`read_group`
    read into ``group`` (its payload drop is left to :func:`finish_group`); then, for an update
    that reports no failure, the evidence it gives (:func:`_weigh_update`). ``mark_processed`` is
    called for a move that needs nothing after the transaction."""
    if outcome.external_error:  # whatever brought it (webhook, read-back, an adopted message): no number kept
        outcome = Outcome(outcome.message_id, outcome.status, redacted_error(outcome.external_error),
                          outcome.update_digest)
    attempt = group.attempts.get(outcome.message_id)
    if attempt is None:
        return Applied("ignored_not_ours")
    applied = _apply_status(session, outcome, attempt, ctx, group) if outcome.status is not None else Applied("stale")
    if applied.failed is None and outcome.update_digest is not None:
        applied = _weigh_update(session, outcome, ctx, group) or applied
    if mark_processed is not None and applied.failed is None and (
            applied.word.startswith("applied_") or applied.word == DELIVERED_BY_EVENTS):
        mark_processed(session, applied.word)
    return applied


def _apply_status(session: Session, outcome: Outcome, attempt: store.OutcomeAttempt, ctx: SendContext,
                  group: GroupRead) -> Applied:
    """Move the attempt to the status the outcome reports, once per (message, status), forward only."""
    # the first of the group's copies of a status is the one that applies it, as one after the other
    new_status = (outcome.message_id, outcome.status) in group.new_statuses
    group.new_statuses.discard((outcome.message_id, outcome.status))
    if not new_status:
        return Applied("duplicate_status")
    current = AttemptState(attempt.state)
    new = advance(current, attempt_state_from_status(outcome.status))
    if new == current:
        return Applied("stale")
    if not _move(session, outcome, attempt, current, new, ctx, group):
        return Applied("stale")  # a concurrent outcome moved it first; its own run carries on from there
    if new is AttemptState.FAILED:
        return Applied("failed", FailedAttempt(attempt.notification_id, AttemptPurpose(attempt.purpose),
                                               outcome.external_error))
    return Applied(f"applied_{new.value}")


def _weigh_update(session: Session, outcome: Outcome, ctx: SendContext, group: GroupRead) -> Applied | None:
    """An update of the message that reports no failure, while the attempt is still unconfirmed:
    keep its digest if it is the first; a second, different one means the message changed again
    after sent without failing, so it moved past sent, whatever the message list says now (the
    field notes: a status can go from delivered back to sent). Recorded as delivered, never left
    to the deadline's fallback. None: nothing learnt."""
    attempt = group.attempts[outcome.message_id]
    current = AttemptState(attempt.state)
    if current not in UNCONFIRMED_STATES or outcome.update_digest is None:
        return None
    if not store.note_update(session, attempt.id, outcome.update_digest):
        return None
    if not _move(session, outcome, attempt, current, AttemptState.DELIVERED, ctx, group):
        return None
    log.info("notification %s: its message was updated twice without a failure; recorded delivered although "
             "the workspace says %s", attempt.notification_id, current.value)
    return Applied(DELIVERED_BY_EVENTS)


def _move(session: Session, outcome: Outcome, attempt: store.OutcomeAttempt, current: AttemptState, new: AttemptState,
          ctx: SendContext, group: GroupRead) -> bool:
    """The lifecycle's ``record_outcome`` move, its next read-back, its trace; kept in ``group`` so a
    later outcome of the group about the same message starts from here. The move itself is
    recorded with the group's others when it ends (:func:`finish_group`): the group holds the
    attempts' locks, so what it read is what the move finds."""
    if not moves.may_record_outcome(current, new):
        return False
    now = ctx.clock()
    read_next = next_read_at(state=new, reports_read=reports_read(attempt.channel),
                             accepted_at=attempt.accepted_at or now, now=now, plan=readback_plan_of(ctx.settings))
    group.moves.append(moves.OutcomeMove(notification_id=attempt.notification_id, attempt_id=attempt.id,
                                         attempt_number=attempt.number, current=current, new=new,
                                         external_error=outcome.external_error, next_read_at=read_next))
    group.attempts[outcome.message_id] = dataclasses.replace(attempt, state=new.value)
    _trace_outcome(session, attempt, outcome, new)
    if new in (AttemptState.DELIVERED, AttemptState.READ):
        # delivered: no other attempt can be needed any more (when it is the current one)
        group.drops.append((attempt.notification_id, attempt.number))
        if current not in (AttemptState.DELIVERED, AttemptState.READ) and attempt.accepted_at is not None:
            group.delivered.append((attempt.route, max((now - attempt.accepted_at).total_seconds(), 0.0)))
    return True


def _trace_outcome(session: Session, attempt: store.OutcomeAttempt, outcome: Outcome, new: AttemptState) -> None:
    """The outcome, a step in the notification's trace (dispatcher.tracing), while tracing is on."""
    if tracing.enabled():
        tracing.mark(store.trace_parent_of(session, attempt.notification_id), "dispatcher.outcome", {
            "dispatcher.notification_id": attempt.notification_id, "dispatcher.attempt": attempt.number,
            "dispatcher.message_id": outcome.message_id, "dispatcher.state": new.value,
            "dispatcher.status": outcome.status or "-"})


def repair_undecided_failures(ctx: SendContext, enqueuer: Enqueuer, *, failed_before: datetime, limit: int) -> int:
    """Finish what a process killed between recording a failure and deciding left undone.

    A failed first attempt with no decision gets it (by its error code, or as a send failure);
    a failed fallback or retry whose notification is not ended is ended. Both are idempotent.
    """
    with ctx.sessions() as session:
        undecided = worklists.undecided_failures(session, failed_before=failed_before, limit=limit,
                                                 workspace=ctx.settings.workspace_name)
    for notification_id, purpose, error_kind, error_detail in undecided:
        _finish_failure(notification_id, purpose, error_kind, error_detail, ctx, enqueuer)
    return len(undecided)


def finish_owed_decision(notification_id: int, ctx: SendContext, enqueuer: Enqueuer | None) -> str | None:
    """The repair of one notification, at once: a run that finds its current attempt failed with
    the decision still owed (the run that recorded the failure died before it, or is making it now)
    makes it, rather than leave it to the sweep. Idempotent: the decision is a compare-and-set.
    None when nothing is owed."""
    with ctx.sessions() as session:
        owed = worklists.undecided_failures(session, failed_before=None, limit=1,
                                            workspace=ctx.settings.workspace_name, notification_id=notification_id)
    if not owed:
        return None
    return _finish_failure(*owed[0], ctx, enqueuer)


def _finish_failure(notification_id: int, purpose: str, error_kind: str | None, error_detail: str | None,
                    ctx: SendContext, enqueuer: Enqueuer | None) -> str:
    return settle_failure(notification_id, Failure(purpose=purpose, error_kind=error_kind, detail=error_detail), ctx,
                          enqueuer)


def _carries_template(stored: dict[str, Any]) -> bool:
    try:
        return SendPayload.model_validate(stored).template is not None
    except ValidationError:
        return False  # unreadable: no template can be sent from it


def settle_failure(notification_id: int, failure: Failure, ctx: SendContext, enqueuer: Enqueuer | None) -> str:
    """What follows a failure of the notification's current attempt, for every caller alike: the
    send path, the consumer, the deadline sweep and the repair of an owed decision.

    A provider's code that says the person opted out is recorded first (a suppression). Then, in
    one transaction, what the store says of the notification is read, the pure rule
    (:func:`dispatcher.policy.fallback.choose`) says what follows, and one move records it: the
    single fallback decision (a compare-and-set on ``fallback_decision IS NULL``: only its winner
    acts on it), the one template resend, or the end of a fallback that failed too. A fallback or
    a resend is marked enqueued in that transaction and published after it commits."""
    opted_out = failure.error_kind == EXTERNAL_ERROR and record_platform_opt_out(notification_id, failure.detail, ctx)
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        notification = session.get(Notification, notification_id)
        if notification is None:
            return "ignored"
        choice = choose(failure, _facts(session, notification, failure, ctx, provider_opt_out=opted_out),
                        fallback_rules(ctx))
        queue = send_queue(notification.workspace, Priority(notification.priority))  # what follows keeps its lane
        word = _record(session, notification, choice, failure, ctx, now=now, marks=enqueuer is not None)
    if word == "resend_as_template":
        log.info("notification %s: 131047 on free text; resending as the approved template", notification_id)
    elif word in ("fallback", "no_fallback"):
        verdict = "fallback" if word == "fallback" else "none"
        log.info("notification %s: fallback decision %s (%s)", notification_id, verdict, choice.reason)
        metrics.FALLBACK_DECISIONS.labels(decision=verdict).inc()
    if word in ("fallback", "resend_as_template") and enqueuer is not None:
        _publish_marked(notification_id, now, ctx, enqueuer, queue)
    return word


def _facts(session: Session, notification: Notification, failure: Failure, ctx: SendContext, *,
           provider_opt_out: bool) -> Facts:
    """What the rule needs of the notification; its payload is read only for a provider's failure
    of a first send (a 131047 resends the template it carries)."""
    reads_template = failure.error_kind == EXTERNAL_ERROR and failure.purpose not in AFTER_DECISION_PURPOSES
    body = store.load_payload(session, notification.id) if reads_template else None
    return Facts(fallback_route=notification.fallback_route,
                 fallback_configured=(notification.fallback_route or "") in ctx.settings.routes,
                 route_configured=notification.route in ctx.settings.routes,
                 has_template=body is not None and _carries_template(body), provider_opt_out=provider_opt_out)


def _record(session: Session, notification: Notification, choice: Choice, failure: Failure, ctx: SendContext, *,
            now: datetime, marks: bool) -> str:
    """The one move that records ``choice``; ``marks``: what follows is marked enqueued (published after)."""
    if choice.next is Next.END:
        moves.end_failed(session, notification_id=notification.id, error_kind=choice.error_kind or "internal",
                         detail=choice.detail, now=now)
        store.drop_payload(session, notification.id)
        return "fallback_failed"
    if choice.next is Next.RESEND_AS_TEMPLATE:
        channel = ctx.settings.routes[notification.route].channel.value  # configured: the rule checked it
        if moves.resend_as_template(session, notification_id=notification.id, failed_number=notification.current_attempt,
                                    route=notification.route, channel=channel, now=now):
            if marks:
                store.mark_enqueued(session, [notification.id], now=now)
            return "resend_as_template"
    route = ctx.settings.routes.get(notification.fallback_route or "") if choice.fall_back else None
    decision = moves.FallbackDecision(
        fall_back=choice.fall_back, reason=choice.reason, failed=not failure.late, error_kind=choice.error_kind,
        error_detail=choice.detail, fallback_route=notification.fallback_route if choice.fall_back else None,
        fallback_channel=route.channel.value if route is not None else None,
    )
    if not moves.decide_fallback(session, notification_id=notification.id, decision=decision, now=now):
        return "already_decided"
    if not choice.fall_back:
        store.drop_payload(session, notification.id)
    elif marks:
        store.mark_enqueued(session, [notification.id], now=now)
    return "fallback" if choice.fall_back else "no_fallback"


def _publish_marked(notification_id: int, marked_at: datetime, ctx: SendContext, enqueuer: Enqueuer, queue: str) -> None:
    """Publish the send task of a row the deciding transaction marked as enqueued. Marked before,
    not after: a mark written after the publish could land after the task ran and undo its wait
    (``next_try_at``), and the sweep could publish the row a second time in between. A publish
    the broker refuses gives the row to the next sweep."""
    if not enqueuer.enqueue_send([notification_id], queue=queue):
        with ctx.sessions.begin() as session:
            store.forget_enqueued(session, [notification_id], marked_at=marked_at)


def reconcile_attempt(attempt_id: int, ctx: SendContext, enqueuer: Enqueuer) -> str:
    """Read an unconfirmed attempt's message back and apply what the service says; schedule the
    next read (backing off with the attempt's age, none past the horizon), also after a failed read."""
    with ctx.sessions() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None or attempt.message_id is None:
            return "ignored"
        read = worklists.DueRead(attempt.id, attempt.message_id, attempt.conversation_id, attempt.state, attempt.accepted_at,
                             attempt.channel)
    found, _, unreadable = _read_for(ctx, read.conversation_id, read.message_id)
    return _after_read(read, found.get(read.message_id), ctx, enqueuer, unreadable=unreadable)


def reconcile_due(reads: list[worklists.DueRead], ctx: SendContext, enqueuer: Enqueuer) -> dict[str, int]:
    """Read back attempts a sweep took (:func:`dispatcher.lifecycle.worklists.take_due_reads`): one read
    of the message list per conversation answers every one of them on its page (reminders to one
    patient share a conversation); an attempt older than that page gets a read of its own. Each
    gets its next read scheduled, also after a failed read. Raises :class:`Wait` when the shared
    limiter says not now, after handing the attempts not yet read back to the next sweep."""
    results: dict[str, int] = {}
    by_conversation: dict[int | None, list[worklists.DueRead]] = {}
    for read in reads:
        by_conversation.setdefault(read.conversation_id, []).append(read)
    done: set[int] = set()
    try:
        for conversation_id, group in by_conversation.items():
            newest = max(group, key=lambda read: read.message_id)
            found, listed, unreadable = _read_for(ctx, conversation_id, newest.message_id)
            due = {read.message_id for read in group}
            for message_id, news in found.items():
                if message_id not in due:  # the same read answers our other messages on the page, due or not
                    apply_outcome(news, ctx, enqueuer)
            for read in group:
                outcome, failed = found.get(read.message_id), unreadable
                if not unreadable and read.message_id not in listed:  # older than the page: its own read
                    mine, _, failed = _read_for(ctx, conversation_id, read.message_id, past_latest=True)
                    outcome = mine.get(read.message_id)
                result = _after_read(read, outcome, ctx, enqueuer, unreadable=failed)
                done.add(read.attempt_id)
                results[result] = results.get(result, 0) + 1
    except Wait:
        with ctx.sessions.begin() as session:
            for read in reads:
                if read.attempt_id not in done:
                    store.schedule_read(session, read.attempt_id, at=ctx.clock())
        raise
    return results


def _read_for(ctx: SendContext, conversation_id: int | None, message_id: int, *,
              past_latest: bool = False) -> tuple[dict[int, Outcome], set[int], bool]:
    """A read of the conversation's page holding ``message_id``; a read that fails is logged and
    answers nothing (the attempt's next read is scheduled as after any read)."""
    try:
        found, listed = read_page(ctx, conversation_id=conversation_id, message_id=message_id, past_latest=past_latest)
    except ApiError as error:
        log.warning("reconciling conversation %s: %s", conversation_id, type(error).__name__)
        return {}, set(), True
    return found, listed, False


def _after_read(read: worklists.DueRead, outcome: Outcome | None, ctx: SendContext, enqueuer: Enqueuer, *,
                unreadable: bool) -> str:
    state = AttemptState(read.state)
    if outcome is None or outcome.status is None:
        word = "unreadable" if unreadable else "no_status"
    else:
        word = apply_outcome(outcome, ctx, enqueuer)
    if state in UNCONFIRMED_STATES and word in _NOTHING_LEARNT:
        word = weigh_received(read.message_id, ctx, enqueuer) or word
    if word in _NOTHING_LEARNT:
        # Nothing moved it (a move schedules its own next read): the next read as after a read
        # that found nothing new; a read that failed learnt nothing, so it is made again as if it
        # had not been made (the chaos run's 503 on the one read of a delivered message). Scheduled
        # after the outcome, never before: a process killed in between leaves the sweep's hold
        # (READ_HOLD_S), so the read comes again, where a schedule of "never" written first would
        # have lost the outcome for good (the full-size chaos run's relay kills found one).
        now = ctx.clock()
        with ctx.sessions.begin() as session:
            store.schedule_read(session, read.attempt_id, at=next_read_at(
                state=state, reports_read=reports_read(read.channel), accepted_at=read.accepted_at or now, now=now,
                plan=readback_plan_of(ctx.settings), after_read=not unreadable))
    return word


# A read's words that leave an unconfirmed attempt as it was: then what was received is weighed.
_NOTHING_LEARNT = frozenset({"no_status", "unreadable", "stale", "duplicate_status", "applied_sent"})


def weigh_received(message_id: int, ctx: SendContext, enqueuer: Enqueuer | None) -> str | None:
    """Everything ever received about the message, applied or not: a delivery the consumer took
    for another's message because it came before the send was recorded (``ignored_not_ours``), one
    still waiting for a busy consumer. A status it carried past sent is applied; two distinct
    updates without a failure mean the message moved past sent (a late ``sent`` overwrote it) and
    it is recorded delivered. None: nothing there says more than the read did. Called when a read
    of an unconfirmed attempt learnt nothing (reconciliation, the deadline's read)."""
    with ctx.sessions() as session:
        seen = store.received_evidence(session, ctx.settings.workspace_name, message_id)
    if seen.furthest_status is not None:
        word = apply_outcome(Outcome(message_id, seen.furthest_status, None), ctx, enqueuer)
        return word if word.startswith("applied_") else None
    if seen.distinct_updates >= 2:
        word = apply_outcome(Outcome(message_id, "delivered", None), ctx, enqueuer)
        return DELIVERED_BY_EVENTS if word == "applied_delivered" else None
    return None


def read_back_message(message_id: int, ctx: SendContext, enqueuer: Enqueuer) -> str:
    """Read one message's state back now: its report reached the receiver while the store was away
    and was not recorded (a stock workspace never sends it again)."""
    with ctx.sessions() as session:
        attempt = store.attempt_by_message(session, ctx.settings.workspace_name, message_id)
        attempt_id = attempt.id if attempt is not None else None
    if attempt_id is None:
        return "ignored_not_ours"
    return reconcile_attempt(attempt_id, ctx, enqueuer)
