"""The moves of :data:`dispatcher.lifecycle.table.MOVES`, each one compare-and-set.

Every function here is the only code that may write a notification's or an attempt's ``state``
(a test reads the whole package to prove it). Each one is ``UPDATE ... WHERE state IN (<the
move's start states>)``, on the attempt and then, in the same transaction, on the notification,
and answers whether it won: a caller that loses learns that another worker, the consumer or an
operator moved the row first, and stops. Callers own the transaction (``with sessions.begin()``).

Statements are Core, on the tables, so the send path pays no ORM bookkeeping (issue 14 measures it).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Row, String, and_, bindparam, case, exists, false, func, insert, literal, or_, select, text, true, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from dispatcher.lifecycle.announce import announce
from dispatcher.lifecycle.states import (
    SENDABLE_NOTIFICATION_STATES,
    AttemptPurpose,
    AttemptState,
    NotificationState,
    advance,
    notification_state_for,
)
from dispatcher.lifecycle.table import MOVES, NEW, UNDELIVERED_ATTEMPT, Side
from dispatcher.store.account import Account
from dispatcher.store.built_once import built_once
from dispatcher.store.db import ANNOUNCE_KEY, BoundCondition, dialect_insert, only_a_transaction_carries_the_timeouts
from dispatcher.store.models import Attempt, Notification, table_of
from dispatcher.store.queries import LOAD_FOR_SEND, PAYLOAD_CONTACT_KEYS, CachedTarget, cached_target_of_payload

NOTIFICATIONS = table_of(Notification)
ATTEMPTS = table_of(Attempt)
DETAIL_MAX_CHARS = 200  # the error_detail columns


def _starts_for(move: str, side: str, end: str) -> list[str]:
    """The states from which ``move`` may lead ``side`` to ``end``, by the table's edges: the
    compare-and-set's ``WHERE state IN (...)``. Raises if the table has no such edge."""
    chosen: Side | None = getattr(MOVES[move], side)
    starts = sorted(start for start, stop in (chosen.edges if chosen else ()) if stop == end and start != NEW)
    assert starts, f"{move} cannot lead the {side} to {end}"
    return starts


def _kept(move: str, side: str) -> list[str]:
    """The states ``move`` keeps while it sets other fields (its edges from a state to itself)."""
    chosen: Side | None = getattr(MOVES[move], side)
    kept = sorted(start for start, stop in (chosen.edges if chosen else ()) if start == stop)
    assert kept, f"{move} keeps no {side} state"
    return kept


def _ends_in(move: str, side: str, state: str) -> str:
    chosen: Side | None = getattr(MOVES[move], side)
    assert chosen is not None and state in chosen.end, f"{move} cannot lead the {side} to {state}"
    return state


def _one_statement(session: Session) -> bool:
    """PostgreSQL runs a move's two updates as one statement (data-modifying CTEs), one round trip
    instead of two on the hot path; SQLite has no such CTEs and runs them one after the other in
    its transaction, with the same guards."""
    return session.get_bind().dialect.name == "postgresql"


def _both_or_neither_statement(taken: Any, move_notification: Any) -> Any:
    """``WITH taken AS (<the attempt's guarded update> RETURNING ...), moved AS (<the notification's
    guarded update, only when the attempt's won>) SELECT * FROM taken``: the attempt's row, or no
    row when its guard refused (and then the notification is left alone too). ``taken`` is the
    attempt's update as a CTE; the caller builds the statement once."""
    moved = move_notification.where(exists(select(taken.c[0]))).cte("moved")
    return select(taken).add_cte(moved)


def _won(result: Any) -> bool:
    return bool(result.rowcount == 1)


def _detail(text: str | None) -> str | None:
    return (text or "")[:DETAIL_MAX_CHARS] or None


@dataclass(frozen=True)
class Target:
    """Where one createMessage call goes, recorded when the attempt is claimed."""

    inbox_id: int
    contact_id: int
    conversation_id: int
    channel: str
    content_hash: str


@dataclass(frozen=True)
class Accepted:
    """What the accepted attempt was sent through (for the notification's record)."""

    inbox_id: int | None
    channel: str
    conversation_id: int | None


# --- creating rows ----------------------------------------------------------------------------


def created_state(send_at: datetime | None) -> str:
    """The state the ``create`` move gives a notification: scheduled when it has a time, else queued."""
    state = NotificationState.SCHEDULED if send_at is not None else NotificationState.QUEUED
    return _ends_in("create", "notification", state)


def new_notification(*, send_at: datetime | None, **fields: Any) -> Notification:
    """A notification as the ``create`` move makes it."""
    return Notification(state=created_state(send_at), send_at=send_at, **fields)


def create_many(session: Session, rows: list[dict[str, Any]]) -> dict[str, int]:
    """Insert many notifications at once (a host's batch), each as ``create`` makes it, in one
    statement; their IDs by event ID. A row whose event ID exists already fails the statement
    (the caller's transaction is then undone, and it hands the items over one by one)."""
    if not rows:
        return {}
    values = [{**row, "state": created_state(row["send_at"])} for row in rows]
    inserted = session.execute(insert(NOTIFICATIONS).returning(NOTIFICATIONS.c.id, NOTIFICATIONS.c.event_id), values)
    return {event_id: notification_id for notification_id, event_id in inserted}


# What a run reads of the attempt it opens (the send path's guards and its recovery).
SEND_COLUMNS = (
    ATTEMPTS.c.id, ATTEMPTS.c.state, ATTEMPTS.c.tries, ATTEMPTS.c.lease_until, ATTEMPTS.c.conversation_id,
    ATTEMPTS.c.content_hash, ATTEMPTS.c.in_flight_since, ATTEMPTS.c.error_kind, ATTEMPTS.c.claims, ATTEMPTS.c.runs,
)


def open_attempt(session: Session, *, notification_id: int, number: int, route: str, channel: str, now: datetime,
                 columns: tuple[Any, ...] = SEND_COLUMNS) -> Row[Any]:
    """Make the attempt (queued) or, when it exists, count one more run: one statement either way.

    The run is counted before it does anything, so a task that keeps dying mid-run is seen
    (``runs``, the crash guard); a run that ends without dying gives it back (:func:`end_run`).
    Provider tries are counted apart, only for calls that reached the workspace (:func:`count_try`).
    """
    return session.execute(_open_attempt_statement(columns), {
        "notification_id": notification_id, "number": number, "purpose": AttemptPurpose.FIRST.value,  # the column default
        "route": route, "channel": channel, "state": _ends_in("open_attempt", "attempt", AttemptState.QUEUED),
        "now": now}).one()


@functools.cache
def _open_attempt_statement(columns: tuple[Any, ...]) -> Any:
    """``open_attempt``'s upsert, written once as SQL that SQLite and PostgreSQL both take: SQLAlchemy
    2.0 caches no dialect's ``INSERT ... ON CONFLICT``, so built as Core it would be compiled anew
    for every send (about a tenth of a warm send's CPU, ``scripts/bench/db_cost.py --profile``).
    The columns and defaults are the ones the Core insert wrote (``purpose``'s and ``claims``'
    defaults, the workspace as a subquery of the notification); results are typed by ``columns``."""
    attempts, notifications = ATTEMPTS.name, NOTIFICATIONS.name
    returned = ", ".join(column.name for column in columns)
    return text(
        f"INSERT INTO {attempts} (notification_id, workspace, number, purpose, route, channel, state, tries, runs,"
        " claims, created_at, updated_at)"
        f" VALUES (:notification_id, (SELECT workspace FROM {notifications} WHERE id = :notification_id), :number,"
        " :purpose, :route, :channel, :state, 0, 1, 0, :now, :now)"
        f" ON CONFLICT (notification_id, number) DO UPDATE SET runs = {attempts}.runs + 1, updated_at = :now"
        f" RETURNING {returned}"
    ).bindparams(bindparam("now", type_=ATTEMPTS.c.updated_at.type)).columns(*columns)


@dataclass(frozen=True)
class CountedRun:
    """The current attempt as a send reads it, its run counted (:func:`open_attempt`)."""

    id: int
    state: str
    tries: int
    lease_until: datetime | None
    conversation_id: int | None
    content_hash: str | None
    in_flight_since: datetime | None
    error_kind: str | None
    claims: int
    runs: int


@dataclass(frozen=True)
class LoadedRun:
    """What :func:`load_and_count_run` read: the notification (``store.load_for_send``'s row, None
    when there is no such notification); its current attempt with this run counted (None: not
    counted, nothing to send); and what the store knows of its contact for the inbox
    ``target_inbox_id``, read with it (None: not read with the load, ask ``store.cached_target``)."""

    notification: Row[Any] | None
    attempt: CountedRun | None
    target: CachedTarget | None = None
    target_inbox_id: int | None = None


def load_and_count_run(session: Session, *, notification_id: int, channels: Mapping[str, str],
                       inboxes: Mapping[str, int], account: Account, now: datetime) -> LoadedRun:
    """What a send reads of its notification and, when the notification is still to be sent and
    its current attempt's route is configured (one of ``channels``: route name to channel), that
    attempt with this run counted (:func:`open_attempt`, made on its first run).

    PostgreSQL reads, counts and finds the cached target in one statement (the load as a CTE, the
    upsert as another, the target as a LATERAL join on the keys the payload holds and the route's
    inbox in ``inboxes``, route name to inbox ID, as this process knows them): one round trip. SQLite
    reads and counts in two statements, in the caller's transaction, and leaves the target out."""
    if _one_statement(session):
        row = session.execute(_LOAD_AND_COUNT_RUN(session), {
            "notification_id": notification_id, "channels": dict(channels), "inboxes": dict(inboxes),
            "instance": account.instance, "account_id": account.id, "now": now}).one_or_none()
        if row is None or row.run_id is None:
            return LoadedRun(row, None)
        counted = CountedRun(**{column.name: getattr(row, f"run_{column.name}") for column in SEND_COLUMNS})
        keyed = isinstance(row.body, dict) and PAYLOAD_CONTACT_KEYS in row.body  # written at intake since issue 46
        inbox_id = inboxes.get(row.attempt_route or row.route)
        if not keyed or inbox_id is None:
            return LoadedRun(row, counted)
        return LoadedRun(row, counted, CachedTarget(row.target_contact_id, row.target_source_id,
                                                    row.target_conversation_id, row.target_last_incoming_at), inbox_id)
    notification = session.execute(LOAD_FOR_SEND, {"notification_id": notification_id}).one_or_none()
    if notification is None or notification.state not in SENDABLE_NOTIFICATION_STATES:
        return LoadedRun(notification, None)
    route = notification.attempt_route or notification.route  # the first attempt's row is made by its first run
    channel = channels.get(route)
    if channel is None:
        return LoadedRun(notification, None)
    attempt = open_attempt(session, notification_id=notification_id, number=notification.current_attempt,
                           route=route, channel=channel, now=now)
    return LoadedRun(notification, CountedRun(**attempt._asdict()))


@built_once
def _LOAD_AND_COUNT_RUN(dialect: str) -> Any:  # noqa: N802 (a statement, named as the constant it is)
    """:func:`load_and_count_run` on PostgreSQL: ``WITH loaded AS (<the load>), counted AS (INSERT
    ... SELECT FROM loaded ... ON CONFLICT DO UPDATE SET runs = runs + 1 RETURNING ...) SELECT
    loaded.*, counted.*, cached_target.* FROM loaded LEFT JOIN counted ON true LEFT JOIN LATERAL
    (<the payload's keys' cached target for the route's inbox>) cached_target ON true``. The upsert is open_attempt's, made
    only for a notification still to be sent whose route is among the ``channels`` parameter (a
    JSON object: route name to channel, the new row's channel)."""
    assert dialect == "postgresql", "data-modifying CTEs are PostgreSQL's"
    loaded = LOAD_FOR_SEND.add_columns(NOTIFICATIONS.c.workspace).cte("loaded")
    channels: Any = bindparam("channels", type_=postgresql.JSONB)
    at: Any = bindparam("now", type_=ATTEMPTS.c.updated_at.type)
    route_of_attempt = func.coalesce(loaded.c.attempt_route, loaded.c.route)
    new_row = select(
        loaded.c.id, loaded.c.workspace, loaded.c.current_attempt, literal(AttemptPurpose.FIRST.value),
        loaded.c.route, channels.op("->>")(loaded.c.route), literal(str(_ends_in("open_attempt", "attempt", AttemptState.QUEUED))),
        literal(0), literal(1), literal(0), at, at,
    ).where(loaded.c.state.in_([literal(str(state)) for state in sorted(SENDABLE_NOTIFICATION_STATES)]),
            channels.op("->>")(route_of_attempt).is_not(None))
    upsert = postgresql.insert(ATTEMPTS).from_select(
        ["notification_id", "workspace", "number", "purpose", "route", "channel", "state", "tries", "runs", "claims",
         "created_at", "updated_at"], new_row)
    counted = upsert.on_conflict_do_update(
        index_elements=["notification_id", "number"], set_={"runs": ATTEMPTS.c.runs + 1, "updated_at": at},
    ).returning(*SEND_COLUMNS).cte("counted")
    inboxes: Any = bindparam("inboxes", type_=postgresql.JSONB)
    target = cached_target_of_payload(loaded.c.body, inboxes.op("->>")(route_of_attempt).cast(BigInteger),
                                      instance=bindparam("instance", type_=String()),
                                      account_id=bindparam("account_id", type_=BigInteger()))
    return (select(*(loaded.c[column.name] for column in LOAD_FOR_SEND.selected_columns),
                   *(counted.c[column.name].label(f"run_{column.name}") for column in SEND_COLUMNS),
                   *(column.label(f"target_{column.name}") for column in target.c))
            .select_from(loaded.outerjoin(counted, true()).outerjoin(target, true())))


# --- before the message exists ------------------------------------------------------------------


def release_due(session: Session, notification_ids: list[int], *, now: datetime) -> None:
    """Scheduled notifications whose time has come become queued. Their time is read again here,
    not only by the sweep's query: a host may have moved it later in between (:func:`reschedule`)."""
    if notification_ids:
        session.execute(
            update(NOTIFICATIONS)
            .where(NOTIFICATIONS.c.id.in_(notification_ids), NOTIFICATIONS.c.send_at <= now,
                   NOTIFICATIONS.c.state.in_(_starts_for("release_due", "notification", NotificationState.QUEUED)))
            .values(state=NotificationState.QUEUED, updated_at=now)
        )


def reschedule(session: Session, *, notification_id: int, send_at: datetime, now: datetime) -> bool:
    """A scheduled notification goes out at ``send_at`` instead (the caller checked it is in the
    future). False when it is no longer scheduled: its time came, or it was cancelled."""
    return _won(session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id, NOTIFICATIONS.c.state.in_(_kept("reschedule", "notification")))
        .values(send_at=send_at, updated_at=now)
    ))


CANCELLED = "cancelled"  # the error_kind of a cancelled notification and of its current attempt


class CancelLost(Exception):
    """The cancel took the attempt but the notification had moved on: raised so that the caller's
    transaction rolls the attempt's change back (both rows move, or neither)."""


def cancel(session: Session, *, notification_id: int, number: int, route: str, channel: str, detail: str,
           now: datetime) -> bool:
    """The host cancels: the current attempt (number ``number``) ends failed, from queued or before
    its row exists, and the notification ends cancelled. False: the attempt is not queued (a run
    has claimed it, its message may exist: too late), and nothing is changed.

    The attempt's row is where a cancel meets a send: a claim is a compare-and-set on that row,
    and a run that has not opened it yet finds it failed. So the row is written first, made here
    when no run has made it (``route`` and ``channel`` are then the first attempt's), locking it
    in the order every other move does, attempt before notification. Raises :class:`CancelLost`
    when the notification moved meanwhile (its caller's transaction must not commit)."""
    taken = session.execute(_CANCEL_ATTEMPT(session), {
        "notification_id": notification_id, "number": number, "route": route, "channel": channel,
        "state": _ends_in("cancel", "attempt", AttemptState.FAILED), "error_detail": _detail(detail), "now": now,
    }).scalar_one_or_none()
    if taken is None:
        return False
    moved = session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id, NOTIFICATIONS.c.current_attempt == number,
               NOTIFICATIONS.c.state.in_(_starts_for("cancel", "notification", NotificationState.CANCELLED)))
        .values(state=NotificationState.CANCELLED, error_kind=CANCELLED, error_detail=_detail(detail),
                next_try_at=None, updated_at=now)
    )
    if not _won(moved):
        raise CancelLost(notification_id)
    announce(session, notification_id, now=now)
    return True


@built_once
def _CANCEL_ATTEMPT(dialect: str) -> Any:  # noqa: N802 (a statement, named as the constant it is)
    """:func:`cancel`'s write of the attempt: made failed, or a queued one made failed (an upsert)."""
    now = bindparam("now", type_=ATTEMPTS.c.created_at.type)
    statement = dialect_insert(dialect)(ATTEMPTS).values(
        notification_id=bindparam("notification_id"), workspace=_workspace_of(bindparam("notification_id")),
        number=bindparam("number"), route=bindparam("route"), channel=bindparam("channel"), tries=0, runs=0,
        created_at=now, state=bindparam("state"), error_kind=CANCELLED, error_detail=bindparam("error_detail"),
        lease_until=None, status_at=now, updated_at=now)
    failed = {column: statement.excluded[column]
              for column in ("state", "error_kind", "error_detail", "lease_until", "status_at", "updated_at")}
    return (statement.on_conflict_do_update(
        index_elements=[ATTEMPTS.c.notification_id, ATTEMPTS.c.number], set_=failed,
        where=ATTEMPTS.c.state.in_(_starts_for("cancel", "attempt", AttemptState.FAILED)))
        .returning(ATTEMPTS.c.id))


def _claimable(attempt_id: Any, seen_claims: Any, now: Any) -> Any:
    """The claim's guard on the attempt: queued or unknown, or in flight past its lease; and not
    claimed by anyone since the caller read it (``seen_claims``)."""
    start = _starts_for("claim", "attempt", AttemptState.IN_FLIGHT)
    return and_(
        ATTEMPTS.c.id == attempt_id,
        ATTEMPTS.c.claims == seen_claims,
        or_(
            ATTEMPTS.c.state.in_([state for state in start if state != AttemptState.IN_FLIGHT]),
            (ATTEMPTS.c.state == AttemptState.IN_FLIGHT) & (ATTEMPTS.c.lease_until < now),
        ),
    )


def _held(attempt_id: int, seen_claims: int | None, now: datetime) -> Any:
    """The attempt is the calling run's to move on: nobody claimed it since the run read it
    (``seen_claims``: its claims as the run knows them, its own claim included). A refusal, a pause
    or a lost answer that one run met must not move an attempt another run has since claimed and
    is sending: that run's message would go unrecorded, and a fallback or a resend follow it.
    None: the caller did not read the attempt; then only no live lease of another run stops it."""
    if seen_claims is not None:
        return and_(ATTEMPTS.c.id == attempt_id, ATTEMPTS.c.claims == seen_claims)
    return and_(ATTEMPTS.c.id == attempt_id,
                or_(ATTEMPTS.c.state != AttemptState.IN_FLIGHT, ATTEMPTS.c.lease_until < now))


def claim(session: Session, *, notification_id: int, attempt_id: int, fallback: bool, target: Target, now: datetime,
          lease_until: datetime, seen_claims: int, refused_when: BoundCondition | None = None) -> bool:
    """Take the attempt for one createMessage call: from queued or unknown, or from an expired lease,
    and only if no other worker claimed it since this one read it (``seen_claims``, the attempt's
    ``claims`` as read). Without that, a worker that looked for an earlier try's message and found
    none could claim after another worker's call, unseen by its look, had sent one.

    ``refused_when``: a condition under which the claim must not happen (the recipient opted out,
    :func:`dispatcher.store.suppressions.refusal_clause`), checked by the same statement."""
    refusal = refused_when if refused_when is not None else _NEVER_REFUSED
    statements = _claim_statements(fallback, refusal.clause)
    params = {**refusal.params, "move_attempt_id": attempt_id, "move_seen_claims": seen_claims, "move_at": now,
              "move_lease_until": lease_until, "move_inbox_id": target.inbox_id, "move_contact_id": target.contact_id,
              "move_conversation_id": target.conversation_id, "move_content_hash": target.content_hash,
              "move_notification_id": notification_id, "move_channel": target.channel}
    if _one_statement(session):
        return session.execute(statements.both, params).one_or_none() is not None
    if not _won(session.execute(statements.attempt, params)):
        return False
    session.execute(statements.mirror, params)
    return True


_NEVER_REFUSED = BoundCondition(false())


@functools.cache
def _claim_statements(fallback: bool, refused_when: Any) -> _MoveStatements:
    """``claim``'s statements for a first attempt or a fallback and a shape of refusal, built once
    (as :func:`_outcome_statements`); the refusal's own parameters come with it. The cache tells
    refusals apart by the clause's identity: pass clauses built once (as ``refusal_clause`` does),
    never one built for the call, or the cache grows with every claim."""
    at: Any = bindparam("move_at")
    inbox_id: Any = bindparam("move_inbox_id")
    conversation_id: Any = bindparam("move_conversation_id")
    take_attempt = (
        update(ATTEMPTS)
        .where(_claimable(bindparam("move_attempt_id"), bindparam("move_seen_claims"), at), ~refused_when)
        .values(state=AttemptState.IN_FLIGHT, lease_until=bindparam("move_lease_until"), claims=ATTEMPTS.c.claims + 1,
                in_flight_since=at, updated_at=at, inbox_id=inbox_id, contact_id=bindparam("move_contact_id"),
                conversation_id=conversation_id, content_hash=bindparam("move_content_hash"))
    )
    sending = NotificationState.FALLING_BACK if fallback else NotificationState.SENDING
    move_notification = (
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == bindparam("move_notification_id"),
               NOTIFICATIONS.c.state.in_(_starts_for("claim", "notification", sending)))
        # The notification's record describes its current attempt: where this call goes, and no
        # message yet (a fallback's claim must not pair the first route's message with its own inbox).
        # The claiming run touches the row's run lease too, as touch_for_run does (the sweep).
        .values(state=sending, inbox_id=inbox_id, channel=bindparam("move_channel"),
                conversation_id=conversation_id, message_id=None, accepted_at=None, updated_at=at,
                enqueued_at=at, task_started=True, next_try_at=None, **_wait_over())
    )
    both = _both_or_neither_statement(take_attempt.returning(ATTEMPTS.c.id).cte("taken"), move_notification)
    return _MoveStatements(attempt=take_attempt, mirror=move_notification, both=both)


def release(session: Session, *, attempt_id: int, seen_claims: int, now: datetime) -> bool:
    """createMessage was not made, or was refused in a way a later try may get past: queued again."""
    return _won(session.execute(
        update(ATTEMPTS)
        .where(_held(attempt_id, seen_claims, now),
               ATTEMPTS.c.state.in_(_starts_for("release", "attempt", AttemptState.QUEUED)))
        .values(state=AttemptState.QUEUED, lease_until=None, updated_at=now)
    ))


def mark_unknown(session: Session, *, attempt_id: int, seen_claims: int, now: datetime,
                 no_resend: tuple[str, str] | None = None) -> bool:
    """createMessage ended without an answer. ``no_resend`` (an error_kind and its detail): the
    next run looks, never resends; the attempt shows why until that run ends it."""
    values: dict[str, Any] = {"state": AttemptState.UNKNOWN, "lease_until": None, "updated_at": now}
    if no_resend is not None:
        values["error_kind"], values["error_detail"] = no_resend[0], _detail(no_resend[1])
    return _won(session.execute(
        update(ATTEMPTS)
        .where(_held(attempt_id, seen_claims, now),
               ATTEMPTS.c.state.in_(_starts_for("mark_unknown", "attempt", AttemptState.UNKNOWN)))
        .values(**values)
    ))


def wait_for_workspace(session: Session, *, notification_id: int, attempt_id: int | None, seen_claims: int | None,
                       reason: str, detail: str, now: datetime) -> None:
    """The workspace refused the token or could not be reached: the attempt (if the run had one)
    goes back to queued (no try was counted: the call never got an answer that could fail it),
    and the notification shows why it waits."""
    if attempt_id is not None:
        session.execute(
            update(ATTEMPTS)
            .where(_held(attempt_id, seen_claims, now),
                   ATTEMPTS.c.state.in_(_starts_for("wait_for_workspace", "attempt", AttemptState.QUEUED)))
            .values(state=AttemptState.QUEUED, lease_until=None, updated_at=now)
        )
    session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id, NOTIFICATIONS.c.state.in_(_kept("wait_for_workspace", "notification")))
        .values(error_kind=reason, error_detail=_detail(detail), updated_at=now)
    )


QUIET_HOURS = "quiet_hours"  # the error_kind of a notification waiting for its route's send window
# Why a notification waited (a paused workspace, quiet hours): said until a claim ends the wait.
WAITING_KINDS = frozenset({"auth", "unreachable", QUIET_HOURS})


def _wait_over() -> dict[str, Any]:
    """The notification's error columns once a claim ends its wait: a waiting reason goes, any other stays."""
    waited = NOTIFICATIONS.c.error_kind.in_(sorted(WAITING_KINDS))
    return {"error_kind": case((waited, None), else_=NOTIFICATIONS.c.error_kind),
            "error_detail": case((waited, None), else_=NOTIFICATIONS.c.error_detail)}


def wait_for_window(session: Session, *, notification_id: int, detail: str, now: datetime) -> None:
    """The attempt's route is in its quiet hours: nothing was called; the notification shows until
    when it waits (the attempt stays queued, and the run ends with :func:`end_run`)."""
    session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id, NOTIFICATIONS.c.state.in_(_kept("wait_for_window", "notification")))
        .values(error_kind=QUIET_HOURS, error_detail=_detail(detail), updated_at=now)
    )


def count_try(session: Session, *, attempt_id: int, now: datetime, max_tries: int) -> int | None:
    """A call of this attempt's reached the workspace and failed: one provider try. The attempt's
    tries after it, or None when the attempt moved on (or already counts ``max_tries``)."""
    tries: int | None = session.execute(
        update(ATTEMPTS)
        .where(ATTEMPTS.c.id == attempt_id, ATTEMPTS.c.state.in_(_kept("count_try", "attempt")),
               ATTEMPTS.c.tries < max_tries)
        .values(tries=ATTEMPTS.c.tries + 1, updated_at=now)
        .returning(ATTEMPTS.c.tries)
    ).scalar_one_or_none()
    return tries


def end_run(session: Session, *, attempt_id: int) -> bool:
    """The run counted by :func:`open_attempt` ended without dying: whatever it did (waited for
    the limiter or a lease, lost a race to a twin, retries later), it is no crash."""
    return _won(session.execute(
        update(ATTEMPTS)
        .where(ATTEMPTS.c.id == attempt_id, ATTEMPTS.c.state.in_(_kept("end_run", "attempt")), ATTEMPTS.c.runs > 0)
        .values(runs=ATTEMPTS.c.runs - 1)
    ))


CRASH_LOOP = "crash_loop"  # the error_kind of a notification set aside because its send task keeps dying


WORKSPACE_UNCONFIGURED = "workspace_unconfigured"  # its workspace left the configuration: nothing to send it with
ROUTE_UNCONFIGURED = "route_unconfigured"  # its current attempt's route left the configuration: no inbox to send on
# The sweep leaves these until an operator retries
SET_ASIDE_KINDS = frozenset({CRASH_LOOP, WORKSPACE_UNCONFIGURED, ROUTE_UNCONFIGURED})


def set_aside(session: Session, *, notification_id: int, detail: str, now: datetime,
              error_kind: str = CRASH_LOOP) -> bool:
    """The send task died too often on the current attempt (``crash_loop``), or the notification's
    workspace or its current attempt's route is no longer configured: keep the notification as it is (its attempt may be in
    flight; nothing is failed, nothing falls back), marked with why, so the sweep leaves it until
    an operator retries it (:func:`retry_set_aside`)."""
    assert error_kind in SET_ASIDE_KINDS
    return _won(session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id, NOTIFICATIONS.c.state.in_(_kept("set_aside", "notification")))
        .values(error_kind=error_kind, error_detail=_detail(detail), next_try_at=None, updated_at=now)
    ))


def retry_set_aside(session: Session, *, notification_id: int, now: datetime) -> bool:
    """An operator retries a notification set aside: its current attempt's runs count from zero and
    the sweep publishes it again (``enqueued_at`` cleared). False when it was not set aside."""
    moved = session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id, NOTIFICATIONS.c.error_kind.in_(sorted(SET_ASIDE_KINDS)),
               NOTIFICATIONS.c.state.in_(_kept("retry_set_aside", "notification")))
        .values(error_kind=None, error_detail=None, enqueued_at=None, next_try_at=None, updated_at=now)
        .returning(NOTIFICATIONS.c.current_attempt)
    ).scalar_one_or_none()
    if moved is None:
        return False
    session.execute(
        update(ATTEMPTS)
        .where(ATTEMPTS.c.notification_id == notification_id, ATTEMPTS.c.number == moved,
               ATTEMPTS.c.state.in_(_kept("retry_set_aside", "attempt")))
        .values(runs=0, updated_at=now)
    )
    return True


RE_RESOLVING = "re_resolving"  # the attempt's error_kind while it looks its contact up again, once
RE_RESOLVING_DETAIL = "the workspace no longer has the stored contact or conversation (404): looking them up again, once"


def re_resolve(session: Session, *, attempt_id: int, seen_claims: int, now: datetime) -> bool:
    """A 404 for a stored contact or conversation: back to queued, marked, so a second 404 ends it."""
    return _won(session.execute(
        update(ATTEMPTS)
        .where(_held(attempt_id, seen_claims, now),
               ATTEMPTS.c.state.in_(_starts_for("re_resolve", "attempt", AttemptState.QUEUED)),
               or_(ATTEMPTS.c.error_kind.is_(None), ATTEMPTS.c.error_kind != RE_RESOLVING))
        .values(state=AttemptState.QUEUED, lease_until=None, error_kind=RE_RESOLVING, error_detail=RE_RESOLVING_DETAIL,
                updated_at=now)
    ))


def fail_attempt(session: Session, *, notification_id: int, attempt_id: int, seen_claims: int | None, error_kind: str,
                 detail: str, now: datetime) -> bool:
    """The attempt ends without a message; the notification keeps the reason (its decision follows).
    False: the attempt moved on, or another run has claimed it since this one read it."""
    moved = session.execute(
        update(ATTEMPTS)
        .where(_held(attempt_id, seen_claims, now),
               ATTEMPTS.c.state.in_(_starts_for("fail_attempt", "attempt", AttemptState.FAILED)))
        .values(state=AttemptState.FAILED, error_kind=error_kind,
                error_detail=_detail(detail), lease_until=None, status_at=now, updated_at=now)
    )
    if not _won(moved):
        return False
    session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id, NOTIFICATIONS.c.state.in_(_kept("fail_attempt", "notification")))
        .values(error_kind=error_kind, error_detail=_detail(detail), updated_at=now)
    )
    return True


# --- the message exists -------------------------------------------------------------------------


def accept(session: Session, *, notification_id: int, attempt_id: int, message_id: int, state: AttemptState,
           now: datetime, next_read_at: datetime | None, without_waiting: bool = False) -> Accepted | None:
    """The workspace took the message: record its ID and first status on the attempt and the
    notification, and when reconciliation reads it back first (None: never, it is settled).

    ``without_waiting``: on PostgreSQL the transaction's commit returns before the record is
    flushed to disk (``synchronous_commit`` off for this transaction, set by the statement itself,
    no round trip of its own). Only where a record lost in a database crash is repaired by reading
    the workspace again: the send path's acceptance (recovery finds the message in its conversation
    and adopts it). Never for the claim: losing an in-flight mark could send twice."""
    statements = _accept_statements(state)
    params = {"move_attempt_id": attempt_id, "move_notification_id": notification_id, "move_message_id": message_id,
              "move_at": now, "move_next_read_at": next_read_at}
    if _one_statement(session):
        # the notification takes the attempt's target from the attempt's own update, in the same statement
        row = session.execute(statements.both_without_waiting if without_waiting else statements.both,
                              params).one_or_none()
    else:
        row = session.execute(statements.attempt, params).one_or_none()
        if row is not None:
            session.execute(statements.mirror, {**params, "move_inbox_id": row.inbox_id, "move_channel": row.channel,
                                                "move_conversation_id": row.conversation_id})
    if row is None:
        return None
    announce(session, notification_id, now=now)
    return Accepted(inbox_id=row.inbox_id, channel=row.channel, conversation_id=row.conversation_id)


def outside_a_transaction(session: Session) -> bool:
    """Whether the moves here are one statement each (PostgreSQL), so that a caller whose writes
    are each one guarded move may run them outside a transaction block: each statement its own
    transaction, no BEGIN or COMMIT round trip. Ask before the session's first statement, then take
    its connection in autocommit. Not where the pool shares one connection among sessions (the
    deterministic simulation's, which runs every node on one connection): there another session's
    transaction may be open on it, and every statement stays in the caller's transaction. Nor
    through a pooler in transaction mode, where only a transaction carries the timeouts."""
    return (_one_statement(session) and not isinstance(session.get_bind().engine.pool, StaticPool)
            and not only_a_transaction_carries_the_timeouts(session))


def each_statement_alone(session: Session) -> bool:
    """Where :func:`outside_a_transaction` allows it, take the session's connection in autocommit,
    before its first statement: each statement is then its own transaction, with no BEGIN and no
    COMMIT round trip. For a caller whose writes are each one guarded statement (the claim, the
    count of a delivery's run). Whether it did."""
    if not outside_a_transaction(session):
        return False
    session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    return True


def accept_outside_a_transaction(session: Session, *, drops_payload: bool) -> bool:
    """Whether :func:`accept` is one statement here, so that the send path may run it outside a
    transaction block (then, on PostgreSQL, it is one round trip: no BEGIN, no COMMIT): PostgreSQL,
    no host callback to write with it, no payload to drop with it. The caller asks before the
    session's first statement and then takes its connection in autocommit."""
    return outside_a_transaction(session) and not drops_payload and not session.info.get(ANNOUNCE_KEY)


@functools.cache
def _accept_statements(state: AttemptState) -> _MoveStatements:
    """``accept``'s statements for a first status ``state``, built once (as :func:`_outcome_statements`)."""
    at: Any = bindparam("move_at")
    take_attempt = (
        update(ATTEMPTS)
        .where(ATTEMPTS.c.id == bindparam("move_attempt_id"), ATTEMPTS.c.state.in_(_starts_for("accept", "attempt", state)))
        .values(state=state, message_id=bindparam("move_message_id"), accepted_at=at, status_at=at,
                next_read_at=bindparam("move_next_read_at"), updated_at=at, content_hash=None, lease_until=None,
                error_kind=None, error_detail=None)
        .returning(ATTEMPTS.c.inbox_id, ATTEMPTS.c.channel, ATTEMPTS.c.conversation_id)
    )

    def move_notification(inbox_id: Any, channel: Any, conversation_id: Any) -> Any:
        return (
            update(NOTIFICATIONS)
            .where(NOTIFICATIONS.c.id == bindparam("move_notification_id"),
                   NOTIFICATIONS.c.state.in_(_starts_for("accept", "notification", notification_state_for(state))))
            .values(state=notification_state_for(state), message_id=bindparam("move_message_id"),
                    conversation_id=conversation_id, inbox_id=inbox_id, channel=channel, accepted_at=at,
                    delivery_state=state.value, error_kind=None, error_detail=None, updated_at=at)
        )

    taken = take_attempt.cte("taken")
    both = _both_or_neither_statement(taken, move_notification(
        select(taken.c.inbox_id).scalar_subquery(), select(taken.c.channel).scalar_subquery(),
        select(taken.c.conversation_id).scalar_subquery()))
    mirror = move_notification(bindparam("move_inbox_id"), bindparam("move_channel"), bindparam("move_conversation_id"))
    # SET LOCAL synchronous_commit TO OFF as a function of the statement (set_config's third
    # argument: for this transaction only), evaluated for the attempt's row when the move wins.
    without_waiting = both.where(func.set_config("synchronous_commit", "off", true()).is_not(None))
    return _MoveStatements(attempt=take_attempt, mirror=mirror, both=both, both_without_waiting=without_waiting)


def record_outcome(session: Session, *, notification_id: int, attempt_id: int, attempt_number: int,
                   current: AttemptState, new: AttemptState, external_error: str | None, now: datetime,
                   next_read_at: datetime | None = None) -> bool:
    """Move the attempt from ``current`` to the later ``new``; mirror it on the notification while
    the attempt is the current one (the first, or the fallback once decided) and did not fail.
    ``next_read_at``: when reconciliation reads it back next, after this news (None: never)."""
    if not may_record_outcome(current, new):
        return False
    statements = _outcome_statements(new)
    moving = {"move_attempt_id": attempt_id, "move_from": current.value, "move_at": now,
              "move_next_read_at": next_read_at, "move_detail": _detail(external_error)}
    if statements.mirror is None:  # failed: the notification follows with the fallback decision
        return _won(session.execute(statements.attempt, moving))
    mirroring = {"move_notification_id": notification_id, "move_attempt_number": attempt_number, "move_at": now}
    if _one_statement(session):  # the consumer's hot path: one round trip for both rows
        if session.execute(statements.both, {**moving, **mirroring}).one_or_none() is None:
            return False
    else:
        if not _won(session.execute(statements.attempt, moving)):
            return False
        session.execute(statements.mirror, mirroring)
    announce(session, notification_id, now=now)  # nothing when the notification did not follow (not its current attempt)
    return True


def may_record_outcome(current: AttemptState, new: AttemptState) -> bool:
    """Whether ``record_outcome`` leads an attempt from ``current`` to ``new``: forward only; a
    failure after delivery is not one (the table has no such edge)."""
    return current in _starts_for("record_outcome", "attempt", new) and advance(current, new) == new


@dataclass(frozen=True)
class OutcomeMove:
    """One ``record_outcome`` of a group, for :func:`record_outcomes`."""

    notification_id: int
    attempt_id: int
    attempt_number: int
    current: AttemptState
    new: AttemptState
    external_error: str | None
    next_read_at: datetime | None


class OutcomeMoveRefused(Exception):
    """A move of a group found its attempt in another state than the group read: the group's
    locks were not held. Its transaction must not commit."""


def record_outcomes(session: Session, outcome_moves: Sequence[OutcomeMove], *, now: datetime) -> None:
    """:func:`record_outcome` for the moves of a group of outcomes applied in one transaction, one
    statement per kind of change (the attempts' updates to one state, then their notifications'),
    each an executemany: one round trip on psycopg 3, which pipelines it. A kind with one move is
    :func:`record_outcome` itself, one statement on PostgreSQL.

    The caller read and locked the attempts in this transaction (``attempts_for_outcomes``: row
    locks on PostgreSQL, the write lock of BEGIN IMMEDIATE on SQLite) and chose each move from
    what it read, so every guard holds; one that does not raises :class:`OutcomeMoveRefused`.
    Two moves of one attempt (sent, then delivered) go in the order given, in rounds: a move's
    ``current`` is where the one before it left the attempt, and each announces its own state."""
    rounds: list[list[OutcomeMove]] = []
    moves_of_attempt: dict[int, int] = {}
    for move in outcome_moves:
        turn = moves_of_attempt[move.attempt_id] = moves_of_attempt.get(move.attempt_id, -1) + 1
        if turn == len(rounds):
            rounds.append([])
        rounds[turn].append(move)
    for moves_of_round in rounds:
        by_kind: dict[AttemptState, list[OutcomeMove]] = {}
        for move in moves_of_round:
            by_kind.setdefault(move.new, []).append(move)
        for new, kind in by_kind.items():
            _record_kind(session, new, kind, now=now)


def _record_kind(session: Session, new: AttemptState, kind: list[OutcomeMove], *, now: datetime) -> None:
    if len(kind) == 1:
        [move] = kind
        if not record_outcome(session, notification_id=move.notification_id, attempt_id=move.attempt_id,
                              attempt_number=move.attempt_number, current=move.current, new=move.new,
                              external_error=move.external_error, now=now, next_read_at=move.next_read_at):
            raise OutcomeMoveRefused(f"attempt {move.attempt_id} was not {move.current.value}")
        return
    if not all(may_record_outcome(move.current, new) for move in kind):
        raise OutcomeMoveRefused(f"a move to {new.value} from a state the table has no edge from")
    statements = _outcome_statements(new)
    moved = session.execute(statements.attempt, [
        {"move_attempt_id": move.attempt_id, "move_from": move.current.value, "move_at": now,
         "move_next_read_at": move.next_read_at, "move_detail": _detail(move.external_error)} for move in kind])
    if moved.rowcount != len(kind):  # type: ignore[attr-defined]
        raise OutcomeMoveRefused(f"{len(kind) - moved.rowcount} of {len(kind)} attempts were not where "  # type: ignore[attr-defined]
                                 f"the group read them")
    if statements.mirror is None:  # failed: the notification follows with the fallback decision
        return
    session.execute(statements.mirror, [
        {"move_notification_id": move.notification_id, "move_attempt_number": move.attempt_number, "move_at": now}
        for move in kind])
    for move in kind:
        announce(session, move.notification_id, now=now)  # nothing when the notification did not follow


@dataclass(frozen=True)
class _MoveStatements:
    """A move's statements, built once with bound parameters (named ``move_*``)."""

    attempt: Any  # the attempt's guarded update
    mirror: Any  # the notification's, or None when the move does not mirror (a failure)
    both: Any  # both as one statement (PostgreSQL)
    both_without_waiting: Any = None  # the same, its transaction's commit not waiting for the disk (accept only)


@functools.cache
def _outcome_statements(new: AttemptState) -> _MoveStatements:
    """``record_outcome``'s statements for a move to ``new``, built once: the consumer runs one per
    applied outcome, and a statement built anew costs SQLAlchemy a fresh cache key each time
    (about a fifth of an outcome's CPU, measured by ``scripts/bench/consumer.py --profile``).
    Everything that varies between calls is a bound parameter (named ``move_*``, never a column's
    name: an UPDATE takes a parameter named like a column as one more value to set)."""
    at: Any = bindparam("move_at")
    values: dict[str, Any] = {"state": new, "status_at": at, "updated_at": at, "next_read_at": bindparam("move_next_read_at")}
    if new is AttemptState.FAILED:
        values.update(error_kind="external_error", error_detail=bindparam("move_detail"))
    move_attempt = (update(ATTEMPTS)
                    .where(ATTEMPTS.c.id == bindparam("move_attempt_id"), ATTEMPTS.c.state == bindparam("move_from"))
                    .values(**values))
    if new is AttemptState.FAILED:
        return _MoveStatements(attempt=move_attempt, mirror=None, both=None)
    mirrored = notification_state_for(new)
    mirror = (
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == bindparam("move_notification_id"),
               NOTIFICATIONS.c.current_attempt == bindparam("move_attempt_number"),
               # each state a bound value of its own, not one expanding list: record_outcomes runs
               # this statement as an executemany, which takes no expanding parameter
               NOTIFICATIONS.c.state.in_([literal(state) for state in _starts_for("record_outcome", "notification",
                                                                                    mirrored)]))
        .values(state=mirrored, delivery_state=new.value, updated_at=at)
    )
    both = _both_or_neither_statement(move_attempt.returning(ATTEMPTS.c.id).cte("taken"), mirror)
    return _MoveStatements(attempt=move_attempt, mirror=mirror, both=both)


# --- the single decision and the end ---------------------------------------------------------------


@dataclass(frozen=True)
class FallbackDecision:
    """``fall_back``: through ``fallback_route`` (``channel``). Else, when ``failed``, the
    notification ends failed with ``error_kind`` / ``error_detail`` (kept if it has a reason already)."""

    fall_back: bool
    reason: str
    failed: bool
    error_kind: str | None = None
    error_detail: str | None = None
    fallback_route: str | None = None
    fallback_channel: str | None = None


def decide_fallback(session: Session, *, notification_id: int, decision: FallbackDecision, now: datetime) -> bool:
    """The single fallback decision, on ``fallback_decision IS NULL``: only its winner acts on it."""
    values: dict[str, Any] = {
        "fallback_decision": "fallback" if decision.fall_back else "none",
        "fallback_reason": decision.reason[:DETAIL_MAX_CHARS],
        "fallback_decided_at": now,
        "updated_at": now,
    }
    # A decision after a failure may start from any undecided state; one at the deadline only from
    # accepted or sent, so a delivery report that lands between the sweep's query and this
    # statement wins, and a delivered message gets no fallback. A failure recorded meanwhile (the
    # attempt fails, the notification keeps its state until that failure's own decision) wins
    # too: the decision then says why the message failed, not that it was late.
    move = "decide_fallback" if decision.failed else "decide_at_deadline"
    guards = [NOTIFICATIONS.c.id == notification_id, NOTIFICATIONS.c.fallback_decision.is_(None)]
    if not decision.failed:
        guards.append(exists().where(ATTEMPTS.c.notification_id == NOTIFICATIONS.c.id,
                                     ATTEMPTS.c.number == NOTIFICATIONS.c.current_attempt,
                                     ATTEMPTS.c.state.in_(UNDELIVERED_ATTEMPT)))
    end: str | None = None  # a deadline decision without a route keeps the state
    if decision.fall_back:
        end = NotificationState.FALLING_BACK
        values.update(state=end, enqueued_at=None, current_attempt=NOTIFICATIONS.c.current_attempt + 1)
    elif decision.failed:
        end = NotificationState.FAILED
        values.update(state=end, delivery_state=AttemptState.FAILED.value,
                      error_kind=func.coalesce(NOTIFICATIONS.c.error_kind, decision.error_kind or "failed"),
                      error_detail=func.coalesce(NOTIFICATIONS.c.error_detail, _detail(decision.error_detail or decision.reason)))
    number = session.execute(
        update(NOTIFICATIONS)
        .where(*guards, NOTIFICATIONS.c.state.in_(_starts_for(move, "notification", end) if end
                                                  else _kept(move, "notification")))
        .values(**values)
        .returning(NOTIFICATIONS.c.current_attempt)
    ).scalar_one_or_none()
    if number is not None and decision.fall_back:
        assert decision.fallback_route is not None and decision.fallback_channel is not None
        _new_attempt(session, move, notification_id=notification_id, number=number, purpose=AttemptPurpose.FALLBACK,
                     route=decision.fallback_route, channel=decision.fallback_channel, now=now)
    if number is not None:  # after the fallback's attempt exists: the event names it and its channel
        announce(session, notification_id, now=now)
    return number is not None


def resend_as_template(session: Session, *, notification_id: int, failed_number: int, route: str, channel: str,
                       now: datetime) -> bool:
    """After 131047 on the current attempt's free text: a new attempt, on the same route, that
    must go out as the request's approved template. Once: never after a template attempt exists."""
    number = session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id, NOTIFICATIONS.c.current_attempt == failed_number,
               NOTIFICATIONS.c.fallback_decision.is_(None),
               NOTIFICATIONS.c.state.in_(_starts_for("resend_as_template", "notification", NotificationState.SENDING)),
               ~exists().where(ATTEMPTS.c.notification_id == notification_id,
                               ATTEMPTS.c.purpose == AttemptPurpose.TEMPLATE))
        .values(state=NotificationState.SENDING, current_attempt=failed_number + 1, enqueued_at=None, updated_at=now)
        .returning(NOTIFICATIONS.c.current_attempt)
    ).scalar_one_or_none()
    if number is None:
        return False
    _new_attempt(session, "resend_as_template", notification_id=notification_id, number=number,
                 purpose=AttemptPurpose.TEMPLATE, route=route, channel=channel, now=now)
    return True


def end_failed(session: Session, *, notification_id: int, error_kind: str, detail: str | None, now: datetime) -> bool:
    """Nothing more will be sent (the fallback, or a host's retry, failed too): the notification
    ends failed, with why."""
    won = _won(session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id,
               NOTIFICATIONS.c.state.in_(_starts_for("end_failed", "notification", NotificationState.FAILED)))
        .values(state=NotificationState.FAILED,
                delivery_state=AttemptState.FAILED.value, error_kind=error_kind, error_detail=_detail(detail),
                updated_at=now)
    ))
    if won:
        announce(session, notification_id, now=now)
    return won


def end_opted_out(session: Session, *, notification_id: int, attempt_id: int, error_kind: str, detail: str,
                  now: datetime, seen_claims: int) -> bool:
    """The recipient said no (``opted_out``) or the route's consent is missing (``no_consent``):
    the attempt fails before any call and the notification ends with that reason. The decision is
    stored as "none" (when none was made), so nothing falls back to another channel. The attempt
    is taken only as a claim would take it (never from another worker's live lease, nor after
    anyone claimed it since ``seen_claims`` was read): that worker's call may be running."""
    moved = session.execute(
        update(ATTEMPTS)
        .where(_claimable(attempt_id, seen_claims, now),
               ATTEMPTS.c.state.in_(_starts_for("end_opted_out", "attempt", AttemptState.FAILED)))
        .values(state=AttemptState.FAILED, error_kind=error_kind, error_detail=_detail(detail), lease_until=None,
                status_at=now, updated_at=now)
    )
    if not _won(moved):
        return False
    session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id,
               NOTIFICATIONS.c.state.in_(_starts_for("end_opted_out", "notification", NotificationState.FAILED)))
        .values(state=NotificationState.FAILED, delivery_state=AttemptState.FAILED.value, error_kind=error_kind,
                error_detail=_detail(detail), updated_at=now,
                fallback_decision=func.coalesce(NOTIFICATIONS.c.fallback_decision, "none"),
                fallback_reason=func.coalesce(NOTIFICATIONS.c.fallback_reason, error_kind),
                fallback_decided_at=func.coalesce(NOTIFICATIONS.c.fallback_decided_at, now))
    )
    announce(session, notification_id, now=now)
    return True


def retry_failed(session: Session, *, notification_id: int, route: str, channel: str, now: datetime) -> bool:
    """A host retries a failed notification: it is queued again with a new current attempt (purpose
    ``retry``, on ``route``), its record cleared of the failed attempt's message and error. Its
    fallback decision stays: the retry's failure ends it again, and no second fallback is made.
    False when it is not failed (nothing is changed)."""
    number = session.execute(
        update(NOTIFICATIONS)
        .where(NOTIFICATIONS.c.id == notification_id,
               NOTIFICATIONS.c.state.in_(_starts_for("retry_failed", "notification", NotificationState.QUEUED)))
        # due now: its send deadline counts from the retry, not from the first hand-over
        .values(state=NotificationState.QUEUED, current_attempt=NOTIFICATIONS.c.current_attempt + 1, channel=channel,
                inbox_id=None, conversation_id=None, message_id=None, accepted_at=None, delivery_state=None,
                error_kind=None, error_detail=None, enqueued_at=None, next_try_at=None, send_at=now, updated_at=now)
        .returning(NOTIFICATIONS.c.current_attempt)
    ).scalar_one_or_none()
    if number is None:
        return False
    _new_attempt(session, "retry_failed", notification_id=notification_id, number=number,
                 purpose=AttemptPurpose.RETRY, route=route, channel=channel, now=now)
    return True


def _new_attempt(session: Session, move: str, *, notification_id: int, number: int, purpose: AttemptPurpose,
                 route: str, channel: str, now: datetime) -> None:
    """The attempt a decision, a template resend or a retry makes (queued; kept when a repeat of the
    move finds it made)."""
    session.execute(_NEW_ATTEMPT(session), {"notification_id": notification_id, "number": number, "purpose": purpose,
                                            "route": route, "channel": channel,
                                            "state": _ends_in(move, "attempt", AttemptState.QUEUED), "now": now})


@built_once
def _NEW_ATTEMPT(dialect: str) -> Any:  # noqa: N802 (a statement, named as the constant it is)
    now = bindparam("now", type_=ATTEMPTS.c.created_at.type)
    return dialect_insert(dialect)(ATTEMPTS).values(
        notification_id=bindparam("notification_id"), workspace=_workspace_of(bindparam("notification_id")),
        number=bindparam("number"), purpose=bindparam("purpose"), route=bindparam("route"),
        channel=bindparam("channel"), state=bindparam("state"), tries=0, created_at=now, updated_at=now,
    ).on_conflict_do_nothing()


def _workspace_of(notification_id: Any) -> Any:
    """The notification's workspace, for its attempt's row: a subquery of the insert itself."""
    return select(NOTIFICATIONS.c.workspace).where(NOTIFICATIONS.c.id == notification_id).scalar_subquery()
