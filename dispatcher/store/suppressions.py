"""The suppression list and consent, in the store: who must not be messaged, on what, and why.

A suppression's scope is a channel (or ``*``, every channel) and a category (or ``*``, every
category). Each change leaves a row in ``suppression_changes`` (the audit trail: what, when, why;
never an identifier), and every write here is idempotent: suppressing twice keeps the first
``since``, lifting what is not there changes nothing.

Callers own the transaction. :func:`blocking_reason` is the check the send path makes in the
transaction that claims an attempt.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import bindparam, delete, exists, false, or_, select, true, tuple_
from sqlalchemy.orm import Session

from dispatcher.store.account import Account, of_account
from dispatcher.store.built_once import built_once
from dispatcher.store.db import BoundCondition, dialect_insert, insert_for
from dispatcher.store.models import Consent, KnownContact, Suppression, SuppressionChange, table_of

SUPPRESSIONS = table_of(Suppression)
CHANGES = table_of(SuppressionChange)
CONSENTS = table_of(Consent)
KNOWN = table_of(KnownContact)
ALL = "*"


class Reason(StrEnum):
    KEYWORD = "keyword"  # the recipient replied an opt-out (or opt-in) keyword
    PLATFORM = "platform"  # the provider refused the send because the recipient opted out
    HOST = "host"  # the host said so (Python, CLI, HTTP, an import)
    CONSENT_WITHDRAWN = "consent_withdrawn"


class Blocked(StrEnum):
    """Why a send must not happen: the notification's ``error_kind``."""

    OPTED_OUT = "opted_out"
    NO_CONSENT = "no_consent"


@dataclass(frozen=True)
class Scope:
    channel: str = ALL
    category: str = ALL

    def describe(self) -> str:
        channel = "every channel" if self.channel == ALL else self.channel
        category = "every category" if self.category == ALL else self.category
        return f"{channel}, {category}"


@dataclass(frozen=True)
class SuppressionRecord:
    """One active suppression as a host sees it: the key (a hash), the scope, why and since when."""

    recipient_key: str
    channel: str
    category: str
    reason: str
    since: datetime


_SUPPRESSION_COLUMNS = ("instance", "account_id", "recipient_key", "channel", "category", "reason", "since")


def _suppress_statement(dialect: str, *, taking_over: bool) -> Any:
    """:func:`suppress`'s insert. ``taking_over``: the host's word replaces another reason's row in
    the scope. RETURNING: a row only when inserted or taken over (PostgreSQL's rowcount counts
    skipped conflicts)."""
    statement = dialect_insert(dialect)(SUPPRESSIONS).values({column: bindparam(column) for column in _SUPPRESSION_COLUMNS})
    if taking_over:
        statement = statement.on_conflict_do_update(
            index_elements=[SUPPRESSIONS.c.instance, SUPPRESSIONS.c.account_id, SUPPRESSIONS.c.recipient_key,
                            SUPPRESSIONS.c.channel, SUPPRESSIONS.c.category],
            set_={"reason": statement.excluded.reason}, where=SUPPRESSIONS.c.reason != statement.excluded.reason)
    else:
        statement = statement.on_conflict_do_nothing()
    return statement.returning(SUPPRESSIONS.c.recipient_key)


_SUPPRESS_TAKING_OVER = built_once(functools.partial(_suppress_statement, taking_over=True))
_SUPPRESS = built_once(functools.partial(_suppress_statement, taking_over=False))


def suppress(session: Session, *, account: Account, keys: Sequence[str], scope: Scope, reason: Reason,
             now: datetime) -> int:
    """Record the opt-out for each key; answer how many keys were not suppressed in that scope yet.

    The host's word takes over a row a reply or the provider recorded in the same scope (so that a
    later START, which lifts only those, cannot undo it); nothing else replaces an existing row."""
    added = 0
    statement = _SUPPRESS_TAKING_OVER if reason is Reason.HOST else _SUPPRESS
    for key in keys:
        inserted = session.execute(statement(session), {
            **account.columns, "recipient_key": key, "channel": scope.channel, "category": scope.category,
            "reason": reason.value, "since": now}).first()
        if inserted is not None:
            added += 1
            _audit(session, account, key, scope, "suppressed", reason, now)
    return added


def lift(session: Session, *, account: Account, keys: Sequence[str], scope: Scope, reason: Reason, now: datetime) -> int:
    """Lift the opt-out in exactly this scope (a channel opt-in does not lift an all-channel one)."""
    lifted = 0
    for key in keys:
        removed = session.execute(
            delete(SUPPRESSIONS).where(of_account(SUPPRESSIONS.c, account), SUPPRESSIONS.c.recipient_key == key,
                                       SUPPRESSIONS.c.channel == scope.channel, SUPPRESSIONS.c.category == scope.category)
        )
        if _changed(removed):
            lifted += 1
            _audit(session, account, key, scope, "lifted", reason, now)
    return lifted


def lift_channel(session: Session, *, account: Account, keys: Sequence[str], channel: str, reason: Reason,
                 now: datetime) -> int:
    """An opt-in keyword on a channel: lift what the recipient's replies and the provider recorded
    there (every category), never what the host recorded."""
    rows = session.execute(
        select(SUPPRESSIONS.c.recipient_key, SUPPRESSIONS.c.category)
        .where(of_account(SUPPRESSIONS.c, account), SUPPRESSIONS.c.recipient_key.in_(keys),
               SUPPRESSIONS.c.channel == channel,
               SUPPRESSIONS.c.reason.in_([Reason.KEYWORD.value, Reason.PLATFORM.value]))
    ).all()
    for key, category in rows:
        lift(session, account=account, keys=[key], scope=Scope(channel, category), reason=reason, now=now)
    return len(rows)


def blocking_reason(session: Session, *, account: Account, keys: Sequence[str], channel: str, category: str,
                    needs_consent: bool) -> Blocked | None:
    """Whether a send to ``keys`` on ``channel`` in ``category`` must not happen, and why."""
    if not keys:
        return Blocked.NO_CONSENT if needs_consent else None
    reasons = set(session.scalars(
        select(SUPPRESSIONS.c.reason).distinct()
        .where(of_account(SUPPRESSIONS.c, account), SUPPRESSIONS.c.recipient_key.in_(keys),
               SUPPRESSIONS.c.channel.in_([channel, ALL]), SUPPRESSIONS.c.category.in_([category, ALL]))
    ))
    if reasons - {Reason.CONSENT_WITHDRAWN.value}:
        return Blocked.OPTED_OUT
    if reasons:  # consent withdrawn under any of the recipient's keys: no other key's consent counts
        return Blocked.NO_CONSENT
    if needs_consent and not has_consent(session, account=account, keys=keys, channel=channel):
        return Blocked.NO_CONSENT
    return None


def refusal_clause(*, account: Account, keys: Sequence[str], channel: str, category: str,
                   needs_consent: bool) -> BoundCondition:
    """:func:`blocking_reason` as a SQL condition, for a claim's own ``WHERE``: true when the send
    must not happen. The warm path's claim carries it, so the check costs no round trip of its own
    and holds at the very statement that takes the attempt. Built once for each shape, with the
    account, keys, channel and category as bound parameters (``refuse_*``)."""
    if not keys:
        return _ALWAYS_REFUSED if needs_consent else _NEVER_REFUSED
    return BoundCondition(_refusal_template(needs_consent), {
        "refuse_instance": account.instance, "refuse_account_id": account.id, "refuse_keys": list(keys),
        "refuse_channel": channel, "refuse_category": category})


# Shared clauses: a claim's statements are built once per refusal clause, told apart by identity.
_ALWAYS_REFUSED = BoundCondition(true())
_NEVER_REFUSED = BoundCondition(false())


@functools.cache
def _refusal_template(needs_consent: bool) -> Any:
    instance: Any = bindparam("refuse_instance")
    account_id: Any = bindparam("refuse_account_id")
    keys: Any = bindparam("refuse_keys", expanding=True)
    channel: Any = bindparam("refuse_channel")
    suppressed = exists().where(
        SUPPRESSIONS.c.instance == instance, SUPPRESSIONS.c.account_id == account_id, SUPPRESSIONS.c.recipient_key.in_(keys),
        SUPPRESSIONS.c.channel.in_([channel, ALL]), SUPPRESSIONS.c.category.in_([bindparam("refuse_category"), ALL]))
    if not needs_consent:
        return suppressed
    consented = exists().where(CONSENTS.c.instance == instance, CONSENTS.c.account_id == account_id,
                               CONSENTS.c.recipient_key.in_(keys), CONSENTS.c.channel == channel)
    return or_(suppressed, ~consented)


def has_consent(session: Session, *, account: Account, keys: Sequence[str], channel: str) -> bool:
    return session.execute(
        select(CONSENTS.c.channel)
        .where(of_account(CONSENTS.c, account), CONSENTS.c.recipient_key.in_(keys), CONSENTS.c.channel == channel)
        .limit(1)
    ).first() is not None


def record_consent(session: Session, *, account: Account, keys: Sequence[str], channel: str, reference: str,
                   now: datetime) -> int:
    """Record consent under each key (a newer reference replaces an older one), lifting an earlier
    withdrawal on that channel; how many keys were new."""
    session.execute(delete(SUPPRESSIONS).where(
        of_account(SUPPRESSIONS.c, account), SUPPRESSIONS.c.recipient_key.in_(keys),
        SUPPRESSIONS.c.channel == channel, SUPPRESSIONS.c.reason == Reason.CONSENT_WITHDRAWN.value))
    added = 0
    for key in keys:
        statement = insert_for(session)(CONSENTS).values(
            **account.columns, recipient_key=key, channel=channel, reference=reference, granted_at=now)
        existed = has_consent(session, account=account, keys=[key], channel=channel)
        session.execute(statement.on_conflict_do_update(
            index_elements=[CONSENTS.c.instance, CONSENTS.c.account_id, CONSENTS.c.recipient_key, CONSENTS.c.channel],
            set_={"reference": reference, "granted_at": now}))
        if not existed:
            added += 1
            _audit(session, account, key, Scope(channel, ALL), "consented", Reason.HOST, now)
    return added


def withdraw_consent(session: Session, *, account: Account, keys: Sequence[str], channel: str, now: datetime) -> int:
    """Withdrawing consent is an opt-out: nothing more goes out on ``channel`` until consent is given
    again. Recorded as a suppression too (the audit row is its), so that consent kept under another
    of the person's keys (the phone number, when the host withdraws by its identifier) does not count."""
    withdrawn = 0
    for key in keys:
        removed = session.execute(
            delete(CONSENTS).where(of_account(CONSENTS.c, account), CONSENTS.c.recipient_key == key,
                                   CONSENTS.c.channel == channel))
        if _changed(removed):
            withdrawn += 1
    suppress(session, account=account, keys=keys, scope=Scope(channel, ALL), reason=Reason.CONSENT_WITHDRAWN,
             now=now)
    return withdrawn


def active(session: Session, *, account: Account, keys: Sequence[str] | None = None, limit: int = 1000,
           after: tuple[str, str, str] | None = None) -> list[SuppressionRecord]:
    """Active suppressions in key order (``after``: the last row of the previous page), of ``keys`` when given."""
    query = select(SUPPRESSIONS).where(of_account(SUPPRESSIONS.c, account))
    if keys is not None:
        query = query.where(SUPPRESSIONS.c.recipient_key.in_(keys))
    if after is not None:
        query = query.where(tuple_(SUPPRESSIONS.c.recipient_key, SUPPRESSIONS.c.channel, SUPPRESSIONS.c.category) > after)
    rows = session.execute(
        query.order_by(SUPPRESSIONS.c.recipient_key, SUPPRESSIONS.c.channel, SUPPRESSIONS.c.category).limit(limit)
    ).all()
    return [SuppressionRecord(row.recipient_key, row.channel, row.category, row.reason, row.since) for row in rows]


def keys_of_workspace_contact(session: Session, *, account: Account, contact_id: int) -> list[str]:
    """The keys the contact cache knows a workspace contact by (for a reply or a provider's opt-out)."""
    return list(session.scalars(
        select(KNOWN.c.identity_key).where(of_account(KNOWN.c, account), KNOWN.c.contact_id == contact_id)
    ))


def _changed(result: Any) -> bool:
    return bool(result.rowcount)


def _audit(session: Session, account: Account, key: str, scope: Scope, action: str, reason: Reason, now: datetime) -> None:
    session.execute(CHANGES.insert().values(**account.columns, recipient_key=key, channel=scope.channel,
                                            category=scope.category, action=action, reason=reason.value, at=now))


def suppress_many(session: Session, *, account: Account, entries: Sequence[tuple[str, str, str]], now: datetime) -> int:
    """Suppress (recipient key, channel, category) entries at the host's word (an import), skipping
    those already there, and audit the new ones; how many were new. ``INSERT ... ON CONFLICT DO
    NOTHING RETURNING`` answers exactly the rows it added, in batched statements, so 100,000
    entries take seconds, not minutes."""
    table = SUPPRESSIONS
    rows = [{**account.columns, "recipient_key": key, "channel": channel, "category": category,
             "reason": Reason.HOST.value, "since": now} for key, channel, category in entries]
    new = session.execute(
        insert_for(session)(table).on_conflict_do_nothing()
        .returning(table.c.recipient_key, table.c.channel, table.c.category), rows
    ).all()
    if new:
        session.execute(CHANGES.insert(), [
            {**account.columns, "recipient_key": key, "channel": channel, "category": category,
             "action": "suppressed", "reason": Reason.HOST.value, "at": now} for key, channel, category in new])
    return len(new)
