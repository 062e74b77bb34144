"""Notification and attempt states, their order, and which moves are allowed. Pure.

Delivery states only move forward: sent < delivered < read, and failed ends an attempt. A late
or out-of-order report (a provider callback can say "sent" after "delivered") never moves a
state back; :func:`advance` answers what the state becomes.
"""

from __future__ import annotations

from enum import StrEnum


class AttemptState(StrEnum):
    """One try at one route: the first send, or the single fallback."""

    QUEUED = "queued"  # waiting for a worker
    IN_FLIGHT = "in_flight"  # createMessage may be running right now (a lease says until when)
    UNKNOWN = "unknown"  # createMessage ended without an answer: look for the message before resending
    ACCEPTED = "accepted"  # the service took the message; no delivery status reported yet
    SENT = "sent"
    DELIVERED = "delivered"
    READ = "read"
    FAILED = "failed"  # ends the attempt


class NotificationState(StrEnum):
    """What a host sees: the state of the notification's current attempt, or its end."""

    SCHEDULED = "scheduled"  # send_at in the future; a sweep queues it when due
    QUEUED = "queued"
    SENDING = "sending"
    ACCEPTED = "accepted"
    SENT = "sent"
    DELIVERED = "delivered"
    READ = "read"
    FALLING_BACK = "falling_back"  # the first attempt failed and the fallback is on its way
    FAILED = "failed"  # nothing more will happen
    CANCELLED = "cancelled"  # the host cancelled it before it was sent: nothing was or will be sent


class AttemptPurpose(StrEnum):
    """What an attempt is for, numbered in this order of making: the first send; a resend as the
    approved template on the same route, after 131047 (the customer-service window was closed when
    free text went out); the single fallback; then, only when a host asks, a retry of the failed
    notification, one per ask. A notification has at most one of each of the first three."""

    FIRST = "first"
    TEMPLATE = "template"
    FALLBACK = "fallback"
    RETRY = "retry"  # a host's retry of a failed notification: on its route again, after the decision


# Attempts made after the single fallback decision: their failure ends the notification, and no
# decision, template resend or deadline follows them.
AFTER_DECISION_PURPOSES = frozenset({AttemptPurpose.FALLBACK, AttemptPurpose.RETRY})


# Delivery rank: a report may only raise it. FAILED is terminal, so it outranks everything.
_RANK: dict[AttemptState, int] = {
    AttemptState.QUEUED: 0,
    AttemptState.IN_FLIGHT: 1,
    AttemptState.UNKNOWN: 1,
    AttemptState.ACCEPTED: 2,
    AttemptState.SENT: 3,
    AttemptState.DELIVERED: 4,
    AttemptState.READ: 5,
    AttemptState.FAILED: 6,
}

SENDABLE_ATTEMPT_STATES = frozenset({AttemptState.QUEUED, AttemptState.IN_FLIGHT, AttemptState.UNKNOWN})
# A send task may work on the notification (its current attempt has no message yet).
# Nothing more will be sent or learned: retention may purge these (and only these) once old.
SETTLED_NOTIFICATION_STATES = frozenset(
    {NotificationState.DELIVERED, NotificationState.READ, NotificationState.FAILED, NotificationState.CANCELLED}
)
# Everything else: what the sweeps may still have to repair (few at any moment; found by the state index).
UNSETTLED_NOTIFICATION_STATES = frozenset(NotificationState) - SETTLED_NOTIFICATION_STATES
SENDABLE_NOTIFICATION_STATES = frozenset(
    {NotificationState.QUEUED, NotificationState.SENDING, NotificationState.FALLING_BACK}
)
# Not ended and not waiting for its time: outcomes and decisions may still move it.
OPEN_NOTIFICATION_STATES = frozenset(NotificationState) - {
    NotificationState.FAILED, NotificationState.CANCELLED, NotificationState.SCHEDULED}
ACCEPTED_ATTEMPT_STATES = frozenset(
    {AttemptState.ACCEPTED, AttemptState.SENT, AttemptState.DELIVERED, AttemptState.READ}
)
TERMINAL_NOTIFICATION_STATES = frozenset({NotificationState.READ, NotificationState.FAILED, NotificationState.CANCELLED})
# A host may still cancel it, when its current attempt is queued or not yet made (the cancel move).
CANCELLABLE_NOTIFICATION_STATES = frozenset(
    {NotificationState.SCHEDULED, NotificationState.QUEUED, NotificationState.SENDING, NotificationState.FALLING_BACK}
)
CONFIRMED_NOTIFICATION_STATES = frozenset({NotificationState.DELIVERED, NotificationState.READ})


def rank(state: AttemptState) -> int:
    return _RANK[state]


def advance(current: AttemptState, reported: AttemptState) -> AttemptState:
    """The state after a delivery report: the later of the two; failed stays failed.

    A failure reported after delivered or read contradicts what the channel already said and is
    ignored: it must not start a fallback for a message the customer has.
    """
    if current is AttemptState.FAILED:
        return current
    if reported is AttemptState.FAILED and current in (AttemptState.DELIVERED, AttemptState.READ):
        return current
    return reported if rank(reported) > rank(current) else current


def attempt_state_from_status(status: str | None) -> AttemptState:
    """Map a message's ``status`` field (sent, delivered, read, failed or null) to a state."""
    if status is None:
        return AttemptState.ACCEPTED
    try:
        state = AttemptState(status)
    except ValueError:
        return AttemptState.ACCEPTED  # an unknown status tells us nothing beyond acceptance
    return state if state in (AttemptState.SENT, AttemptState.DELIVERED, AttemptState.READ, AttemptState.FAILED) else AttemptState.ACCEPTED


def notification_state_for(attempt: AttemptState) -> NotificationState:
    """The host-facing state while ``attempt`` is the current attempt (before any fallback decision)."""
    return {
        AttemptState.QUEUED: NotificationState.QUEUED,
        AttemptState.IN_FLIGHT: NotificationState.SENDING,
        AttemptState.UNKNOWN: NotificationState.SENDING,
        AttemptState.ACCEPTED: NotificationState.ACCEPTED,
        AttemptState.SENT: NotificationState.SENT,
        AttemptState.DELIVERED: NotificationState.DELIVERED,
        AttemptState.READ: NotificationState.READ,
        AttemptState.FAILED: NotificationState.FAILED,
    }[attempt]
