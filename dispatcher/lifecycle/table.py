"""Every move of a notification and of its attempts, as data: the one place where states change.

A :class:`Move` lists, for the attempt and for the notification, the edges it may take: pairs of
(start state, end state). :mod:`dispatcher.lifecycle.moves` runs each move as one compare-and-set
whose ``WHERE state IN (...)`` is the set of start states read from here, and checks that the
state it writes is one of the move's end states, so this table is not a description of the code
beside it but the condition the code applies. docs/lifecycle.md draws it
(:mod:`dispatcher.lifecycle.diagram`), and a test keeps the drawing current.

A start of ``NEW`` means the move creates the row. An edge from a state to itself sets fields
(an error, a time) without moving the state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import product

from dispatcher.lifecycle.states import (
    CANCELLABLE_NOTIFICATION_STATES,
    SENDABLE_ATTEMPT_STATES,
    SENDABLE_NOTIFICATION_STATES,
    AttemptState,
    NotificationState,
)

A, N = AttemptState, NotificationState
NEW = "new"  # the start of a move that creates the row


@dataclass(frozen=True)
class Side:
    edges: frozenset[tuple[str, str]]
    guard: str = ""  # a condition besides the state, in words (the move applies it too)

    @property
    def start(self) -> frozenset[str]:
        return frozenset(start for start, _ in self.edges if start != NEW)

    @property
    def end(self) -> frozenset[str]:
        return frozenset(end for _, end in self.edges)


@dataclass(frozen=True)
class Move:
    name: str
    why: str
    attempt: Side | None = None
    notification: Side | None = None


def every(starts: Iterable[str], ends: Iterable[str], guard: str = "") -> Side:
    """Any of ``starts`` to any of ``ends``."""
    return Side(frozenset(product(starts, ends)), guard)


def edges(*pairs: tuple[str, Iterable[str]], guard: str = "") -> Side:
    """Each start to its own ends."""
    return Side(frozenset((start, end) for start, ends in pairs for end in ends), guard)


def kept(states: Iterable[str], guard: str = "") -> Side:
    return Side(frozenset((state, state) for state in states), guard)


ACCEPTED = (A.ACCEPTED, A.SENT, A.DELIVERED, A.READ)
DECIDABLE = (N.QUEUED, N.SENDING, N.ACCEPTED, N.SENT, N.DELIVERED)  # the first attempt, not yet settled
UNDELIVERED = (N.ACCEPTED, N.SENT)  # the first attempt's message exists, no delivery report yet
# The deadline decides only while the current attempt is still this: a failure recorded on it (the
# notification keeps its state until the failure's own decision) decides instead, with its reason.
UNDELIVERED_ATTEMPT = (A.ACCEPTED, A.SENT)
# the attempt after the decision (the fallback's, or a retry's), not yet settled
AFTER_DECISION = (N.QUEUED, N.SENDING, N.FALLING_BACK, N.ACCEPTED, N.SENT, N.DELIVERED)

# A run's own moves on an attempt it read: another run's claim since makes the attempt that run's
# (the moves check the claims the run knows, its own claim included).
HELD = "by the run that holds it: nobody claimed it since that run read it"

MOVES: dict[str, Move] = {
    move.name: move
    for move in (
        Move("create", "a host hands over an event: stored once, by its event ID",
             notification=every([NEW], [N.SCHEDULED, N.QUEUED])),
        Move("release_due", "a scheduled notification's time has come",
             notification=every([N.SCHEDULED], [N.QUEUED], "its send_at has passed (read again by the move)")),
        Move("reschedule", "the host moves a scheduled notification to another time",
             notification=kept([N.SCHEDULED], "the new time is in the future")),
        Move("cancel", "the host cancels a notification before its current attempt is sent: nothing more is sent, "
             "nothing falls back",
             attempt=every([NEW, A.QUEUED], [A.FAILED], "the current attempt, queued or not yet made: it is made failed, "
                           "so no run can claim it"),
             notification=every(CANCELLABLE_NOTIFICATION_STATES, [N.CANCELLED],
                                "in the same transaction as its current attempt's move")),
        Move("open_attempt", "the current attempt's first run makes its row; every run counts one run, the crash guard "
             "(a run that ends without dying gives it back: end_run)",
             attempt=Side(every([NEW], [A.QUEUED]).edges | kept(A).edges)),
        Move("claim", "a worker takes the attempt for one createMessage call, under a lease",
             attempt=every([A.QUEUED, A.UNKNOWN, A.IN_FLIGHT], [A.IN_FLIGHT], "in flight only when its lease ran out; "
                           "nobody claimed it since this worker read it; the recipient has not opted out"),
             notification=edges((N.QUEUED, [N.SENDING]), (N.SENDING, [N.SENDING]), (N.FALLING_BACK, [N.FALLING_BACK]))),
        Move("release", "createMessage was not made (a limiter wait), or refused and may be tried again",
             attempt=every([A.IN_FLIGHT], [A.QUEUED], HELD)),
        Move("mark_unknown", "createMessage ended without an answer: look for the message before any resend",
             attempt=every([A.IN_FLIGHT], [A.UNKNOWN], HELD)),
        Move("accept", "the workspace took the message (answered, or found after an unknown outcome)",
             attempt=every(SENDABLE_ATTEMPT_STATES, ACCEPTED),
             notification=every(SENDABLE_NOTIFICATION_STATES, ACCEPTED)),
        Move("record_outcome", "a delivery report, from a webhook or read back: forward only",
             attempt=edges((A.ACCEPTED, [A.SENT, A.DELIVERED, A.READ, A.FAILED]), (A.SENT, [A.DELIVERED, A.READ, A.FAILED]),
                           (A.DELIVERED, [A.READ])),
             notification=edges((N.ACCEPTED, [N.SENT, N.DELIVERED, N.READ]), (N.SENT, [N.DELIVERED, N.READ]),
                                (N.DELIVERED, [N.READ]), guard="when the attempt is the current one and did not fail")),
        Move("wait_for_workspace", "the workspace refuses the token or cannot be reached: wait, saying why; the try is not counted",
             attempt=edges((A.QUEUED, [A.QUEUED]), (A.IN_FLIGHT, [A.QUEUED]), guard="createMessage was refused or never left; " + HELD),
             notification=kept(SENDABLE_NOTIFICATION_STATES, "records why it waits")),
        Move("wait_for_window", "the attempt's route is in its quiet hours: wait for its send window to open, saying until when",
             notification=kept(SENDABLE_NOTIFICATION_STATES, "records why it waits")),
        Move("count_try", "a call reached the workspace and failed (answered, refused or timed out): one provider try",
             attempt=kept(SENDABLE_ATTEMPT_STATES, "never past retry_max_tries")),
        Move("end_run", "a run ended without dying, whatever it did: its run is not counted as a crash",
             attempt=kept(SENDABLE_ATTEMPT_STATES, "never below zero")),
        Move("set_aside", "the send task died send_max_runs times on the attempt (crash_loop), or its workspace or its "
             "attempt's route is no longer configured: set aside, visibly, until an operator retries it; nothing is sent "
             "or decided meanwhile",
             notification=kept(SENDABLE_NOTIFICATION_STATES, "the sweep publishes it no more")),
        Move("retry_set_aside", "an operator retries a notification set aside: its runs count from zero again",
             notification=kept(SENDABLE_NOTIFICATION_STATES, "only one set aside"),
             attempt=kept(SENDABLE_ATTEMPT_STATES)),
        Move("re_resolve", "the workspace no longer has the stored contact or conversation (404): forget them, try once more",
             attempt=edges((A.QUEUED, [A.QUEUED]), (A.IN_FLIGHT, [A.QUEUED]), guard="once per attempt; nothing was sent; " + HELD)),
        Move("fail_attempt", "the attempt ends without a message (refused, not contactable, tries used up)",
             attempt=every(SENDABLE_ATTEMPT_STATES, [A.FAILED], HELD + " (or, unread, under no live lease)"),
             notification=kept(SENDABLE_NOTIFICATION_STATES, "records the reason; the decision moves the state")),
        Move("decide_fallback", "the single fallback decision after a failed attempt: fall back, or end as failed",
             notification=every(DECIDABLE, [N.FALLING_BACK, N.FAILED], "no decision made yet"),
             attempt=every([NEW], [A.QUEUED], "the fallback's attempt, when it falls back")),
        Move("decide_at_deadline", "the single fallback decision for a message still not delivered at the route's "
             "deadline (read back just before): fall back, or without a route keep waiting for its outcome",
             notification=Side(every(UNDELIVERED, [N.FALLING_BACK]).edges | kept(UNDELIVERED).edges,
                               "no decision made yet; never once it is delivered, nor once its current "
                               "attempt failed (that failure decides, with its reason)"),
             attempt=every([NEW], [A.QUEUED], "the fallback's attempt, when it falls back")),
        Move("resend_as_template", "131047 on free text: send the request's approved template once, on the same route, as a new attempt",
             notification=every([N.ACCEPTED, N.SENT], [N.SENDING], "the failed attempt is the current one; once"),
             attempt=every([NEW], [A.QUEUED], "the template attempt")),
        Move("end_opted_out", "the recipient opted out of the route's channel and category, or the route needs consent "
             "that is not given: no message and no fallback",
             attempt=every(SENDABLE_ATTEMPT_STATES, [A.FAILED], "as a claim would take it: in flight only past its lease, "
                           "nobody claimed it since this worker read it"),
             notification=every(SENDABLE_NOTIFICATION_STATES, [N.FAILED], "ends with opted_out or no_consent")),
        Move("end_failed", "the attempt after the decision failed too (the fallback, or a host's retry): nothing more is sent",
             notification=every(AFTER_DECISION, [N.FAILED])),
        Move("retry_failed", "a host retries a failed notification: one new attempt on its route, same event; the "
             "decision stays made, so no second fallback follows",
             notification=every([N.FAILED], [N.QUEUED], "its content is kept or handed over again"),
             attempt=every([NEW], [A.QUEUED], "the retry attempt, numbered after the last")),
    )
}
