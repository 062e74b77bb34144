"""What operators see of the lifecycle, read from the store into typed records: the dashboard's
counts, one notification's timeline, what is set aside; the gauges' counts by state.
Identifiers, states, times, error kinds and our own plain-words details only: the store keeps no
content or contact data outside the payload, and nothing here reads the payload."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from dispatcher.lifecycle.moves import CRASH_LOOP, SET_ASIDE_KINDS
from dispatcher.store import queries as store
from dispatcher.store.models import AppliedStatus, Attempt, Callback, CallbackEndpoint, Notification, WebhookDelivery

ERROR_WINDOWS = (("last hour", timedelta(hours=1)), ("last day", timedelta(days=1)), ("last week", timedelta(days=7)))
TIMELINE_DELIVERIES = 200  # webhook deliveries shown for one notification's messages, oldest first


@dataclass(frozen=True)
class ErrorCount:
    kind: str
    counts: tuple[int, ...]  # notifications changed in each of ERROR_WINDOWS with this error kind


@dataclass(frozen=True)
class Overview:
    by_state: list[tuple[str, int]]
    errors: list[ErrorCount]
    set_aside: int
    deliveries_set_aside: int


@dataclass(frozen=True)
class PausedWorkspace:
    """A workspace the circuit breaker holds: every worker waits for it (a refused token, no answer)."""

    name: str
    reason: str
    detail: str
    until: datetime  # past: a probe is due


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    what: str  # a short label: "attempt 1 accepted", "fallback decided", ...
    detail: str  # plain words; never content or contact data


def overview(session: Session, *, now: datetime) -> Overview:
    by_state = sorted(session.execute(select(Notification.state, func.count()).group_by(Notification.state)).tuples())
    # One pass over the widest window (the rows with an error kind, by its index), a count per window.
    widest = max(span for _, span in ERROR_WINDOWS)
    counts = {str(row[0]): [int(count or 0) for count in row[1:]] for row in session.execute(
        select(Notification.error_kind,
               *(func.sum(case((Notification.updated_at >= now - span, 1), else_=0)) for _, span in ERROR_WINDOWS))
        .where(Notification.error_kind.is_not(None), Notification.updated_at >= now - widest)
        .group_by(Notification.error_kind))}
    set_aside = session.scalar(select(func.count()).select_from(Notification)
                               .where(Notification.error_kind.in_(sorted(SET_ASIDE_KINDS)))) or 0
    deliveries = session.scalar(select(func.count()).select_from(WebhookDelivery)
                                .where(WebhookDelivery.outcome == store.SET_ASIDE)) or 0
    return Overview(by_state=[(state, count) for state, count in by_state],
                    errors=[ErrorCount(kind, tuple(values)) for kind, values in sorted(counts.items())],
                    set_aside=set_aside, deliveries_set_aside=deliveries)


@dataclass(frozen=True)
class StateCounts:
    """The gauges read at a scrape: notifications by state, those set aside as a crash loop, and
    the webhook deliveries the consumer set aside."""

    by_state: list[tuple[str, int]]
    crash_loops: int
    deliveries_set_aside: int
    callback_urls_paused: int


def state_counts(session: Session) -> StateCounts:
    by_state = session.execute(select(Notification.state, func.count()).group_by(Notification.state)).tuples()
    crash_loops = session.scalar(select(func.count()).select_from(Notification)
                                 .where(Notification.error_kind == CRASH_LOOP)) or 0
    deliveries = session.scalar(select(func.count()).select_from(WebhookDelivery)
                                .where(WebhookDelivery.outcome == store.SET_ASIDE)) or 0
    paused = session.scalar(select(func.count()).select_from(CallbackEndpoint)
                            .where(CallbackEndpoint.paused_at.is_not(None))) or 0
    return StateCounts(by_state=[(state, count) for state, count in by_state], crash_loops=crash_loops,
                       deliveries_set_aside=deliveries, callback_urls_paused=paused)


def set_aside_notifications(session: Session, *, limit: int = 200) -> list[Notification]:
    return list(session.scalars(select(Notification).where(Notification.error_kind.in_(sorted(SET_ASIDE_KINDS)))
                                .order_by(Notification.id.desc()).limit(limit)))


def timeline(session: Session, notification: Notification) -> list[TimelineEntry]:
    """Every step the store knows of, oldest first: the hand-over, each attempt's opening, claim,
    acceptance and outcome, the statuses applied (from webhooks or read-backs), the webhook
    deliveries about its messages, the last read-back, the fallback decision and the callbacks."""
    entries = [TimelineEntry(notification.created_at, "handed over", f"route {notification.route}, workspace "
                                                                      f"{notification.workspace}")]
    if notification.send_at is not None:
        entries.append(TimelineEntry(notification.send_at, "due", "scheduled for this time"))
    if notification.fallback_decided_at is not None:  # before the attempt it opens, at the same instant
        entries.append(TimelineEntry(notification.fallback_decided_at, f"fallback decision: {notification.fallback_decision}",
                                     notification.fallback_reason or "-"))
    attempts = store.attempts_of(session, notification.id)
    for attempt in attempts:
        entries += _attempt_steps(attempt)
    messages = {attempt.message_id: attempt.number for attempt in attempts if attempt.message_id is not None}
    if messages:
        for status, applied_at, message_id in session.execute(
                select(AppliedStatus.status, AppliedStatus.applied_at, AppliedStatus.message_id)
                .where(AppliedStatus.workspace == notification.workspace,
                       AppliedStatus.message_id.in_(list(messages)))).tuples():
            entries.append(TimelineEntry(applied_at, f"attempt {messages[message_id]} {status}",
                                         f"status {status} of message {message_id} recorded"))
        entries += _deliveries(session, notification, messages)
    for callback in session.scalars(select(Callback).where(Callback.notification_id == notification.id)
                                    .order_by(Callback.sequence)):
        told = f"told the host ({callback.status}" + (f", {callback.tries} tries" if callback.tries else "") + ")"
        entries.append(TimelineEntry(callback.delivered_at or callback.occurred_at, f"callback {callback.type}", told))
    return sorted(entries, key=lambda entry: entry.at)  # stable: steps of one instant keep the order above


def _attempt_steps(attempt: Attempt) -> list[TimelineEntry]:
    name = f"attempt {attempt.number}"
    steps = [TimelineEntry(attempt.created_at, f"{name} opened",
                           f"{attempt.purpose} on route {attempt.route} ({attempt.channel})")]
    if attempt.in_flight_since is not None:
        steps.append(TimelineEntry(attempt.in_flight_since, f"{name} claimed", "createMessage called"))
    if attempt.accepted_at is not None:
        steps.append(TimelineEntry(attempt.accepted_at, f"{name} accepted",
                                   f"message {attempt.message_id} in conversation {attempt.conversation_id}"))
    if attempt.last_read_at is not None:
        steps.append(TimelineEntry(attempt.last_read_at, f"{name} read back", "the message list was read (reconciliation)"))
    if attempt.error_kind is not None:
        steps.append(TimelineEntry(attempt.status_at or attempt.updated_at, f"{name} {attempt.state}",
                                   f"{attempt.error_kind}: {attempt.error_detail or '-'} ({attempt.tries} tries)"))
    elif attempt.status_at is not None:
        steps.append(TimelineEntry(attempt.status_at, f"{name} {attempt.state}", f"{attempt.tries} tries"))
    return steps


def _deliveries(session: Session, notification: Notification, messages: dict[int, int]) -> list[TimelineEntry]:
    """The webhook deliveries about the notification's messages (their summaries carry IDs only)."""
    rows = session.execute(select(WebhookDelivery.received_at, WebhookDelivery.event, WebhookDelivery.outcome,
                                  WebhookDelivery.summary["status"].as_string(), WebhookDelivery.message_id)
                           .where(WebhookDelivery.workspace == notification.workspace,
                                  WebhookDelivery.message_id.in_(list(messages)))
                           .order_by(WebhookDelivery.id).limit(TIMELINE_DELIVERIES)).tuples()
    return [TimelineEntry(received_at, f"webhook {event}",
                          f"attempt {messages[message or 0]}: {status or 'no status'}; {outcome or 'waiting'}")
            for received_at, event, outcome, status, message in rows]
