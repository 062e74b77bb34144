"""The host's controls over opt-outs and consent: the same calls from Python, the CLI and HTTP.

Every call is idempotent and answers how many of the recipient's keys it changed. A recipient is
named by any of identifier, phone_number (E.164) and email; only keyed hashes of them are kept,
and no error message repeats a value.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError, model_validator
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.errors import InvalidEvent
from dispatcher.recipients.contact import EMAIL_MAX_CHARS, PLAIN, check_addresses
from dispatcher.recipients.keys import recipient_keys
from dispatcher.settings import ChannelKind, Settings
from dispatcher.store import queries as store
from dispatcher.store import suppressions
from dispatcher.store.models import utcnow
from dispatcher.store.suppressions import ALL, Reason, Scope, SuppressionRecord

CHANNELS = frozenset({ALL, *(kind.value for kind in ChannelKind)})
CATEGORY = r"^(\*|[a-z0-9][a-z0-9_.-]{0,63})$"
IMPORT_CHUNK = 2000


class Recipient(BaseModel):
    """Who an opt-out or a consent is about: any of the host's identifier, a phone number, an e-mail."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    identifier: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200), PLAIN] | None = None
    phone_number: Annotated[str, StringConstraints(strip_whitespace=True)] | None = None
    email: Annotated[str, StringConstraints(strip_whitespace=True, max_length=EMAIL_MAX_CHARS), PLAIN] | None = None

    @model_validator(mode="after")
    def _named(self) -> Recipient:
        check_addresses(self.phone_number, self.email)
        if self.identifier is None and self.phone_number is None and self.email is None:
            raise ValueError("recipient: give an identifier, a phone_number or an email")
        return self

    def keys(self, *, key: bytes) -> list[str]:
        return recipient_keys(key=key, identifier=self.identifier, phone_number=self.phone_number, email=self.email)


def recipient_of(value: Recipient | dict[str, Any], *, field: str = "recipient") -> Recipient:
    if isinstance(value, Recipient):
        return value
    try:
        return Recipient.model_validate(value)
    except ValidationError as error:
        problem = error.errors(include_input=False, include_url=False)[0]
        message = str(problem["msg"]).removeprefix("Value error, ")
        # a key the caller invented may be a phone number or an address: never repeated
        where = ".".join([field, *(str(part) if part in Recipient.model_fields else "*" for part in problem["loc"])])
        name, _, rest = message.partition(": ")
        if rest and " " not in name:
            where, message = f"{field}.{name}" if name != field else field, rest
        raise InvalidEvent(where, message) from None


def scope_of(channel: str | None, category: str | None) -> Scope:
    if channel == "":
        raise InvalidEvent("channel", "is required")
    channel, category = channel or ALL, category or ALL
    if channel not in CHANNELS:
        raise InvalidEvent("channel", f"must be one of {', '.join(sorted(CHANNELS))}")
    if not re.match(CATEGORY, category):
        raise InvalidEvent("category", "must be * or a lower-case name such as service or marketing")
    return Scope(channel=channel, category=category)


@dataclass(frozen=True)
class ImportReport:
    rows: int  # entries read
    added: int  # suppressions that were not there before


class Recipients:
    """Opt-outs and consent for one workspace (the settings' account)."""

    def __init__(self, sessions: sessionmaker[Session], settings: Settings) -> None:
        self.sessions, self.settings = sessions, settings

    def _keys(self, recipient: Recipient | dict[str, Any]) -> list[str]:
        return recipient_of(recipient).keys(key=self.settings.hashing_key)

    def suppress(self, recipient: Recipient | dict[str, Any], *, channel: str | None = None,
                 category: str | None = None) -> int:
        """Opt the recipient out (every channel and category unless narrowed); how many keys were new."""
        keys, scope = self._keys(recipient), scope_of(channel, category)
        with self.sessions.begin() as session:
            return suppressions.suppress(session, account=self.settings.account, keys=keys, scope=scope,
                                         reason=Reason.HOST, now=utcnow())

    def unsuppress(self, recipient: Recipient | dict[str, Any], *, channel: str | None = None,
                   category: str | None = None) -> int:
        """Lift the opt-out recorded in exactly this scope (whoever recorded it); how many were lifted."""
        keys, scope = self._keys(recipient), scope_of(channel, category)
        with self.sessions.begin() as session:
            return suppressions.lift(session, account=self.settings.account, keys=keys, scope=scope,
                                     reason=Reason.HOST, now=utcnow())

    def is_suppressed(self, recipient: Recipient | dict[str, Any], *, channel: str, category: str = "service") -> bool:
        """Whether a notification of ``category`` on ``channel`` would be refused as opted out."""
        keys, scope = self._keys(recipient), scope_of(channel, category)
        if scope.channel == ALL or scope.category == ALL:
            raise InvalidEvent("channel" if scope.channel == ALL else "category",
                               "name the one a notification would have (a send has one channel and one category)")
        with self.sessions() as session:
            blocked = suppressions.blocking_reason(session, account=self.settings.account, keys=keys,
                                                   channel=scope.channel, category=scope.category, needs_consent=False)
        return blocked is not None

    def record_consent(self, recipient: Recipient | dict[str, Any], *, reference: str,
                       channel: str = ChannelKind.WEB_SESSION.value) -> int:
        """Record consent (``reference``: your own consent record's, kept as a keyed hash)."""
        keys, scope = self._keys(recipient), scope_of(channel, None)
        if not isinstance(reference, str) or not reference.strip() or len(reference) > 200:
            raise InvalidEvent("reference", "give your consent record's reference (1 to 200 characters)")
        with self.sessions.begin() as session:
            return suppressions.record_consent(
                session, account=self.settings.account, keys=keys, channel=scope.channel,
                reference=store.event_key(reference.strip(), key=self.settings.hashing_key), now=utcnow())

    def withdraw_consent(self, recipient: Recipient | dict[str, Any], *,
                         channel: str = ChannelKind.WEB_SESSION.value) -> int:
        """Withdrawing consent is an opt-out: waiting notifications on that channel end ``no_consent``."""
        keys, scope = self._keys(recipient), scope_of(channel, None)
        with self.sessions.begin() as session:
            return suppressions.withdraw_consent(session, account=self.settings.account, keys=keys,
                                                 channel=scope.channel, now=utcnow())

    def list(self, recipient: Recipient | dict[str, Any] | None = None, *, limit: int = 100,
             after: tuple[str, str, str] | None = None) -> list[SuppressionRecord]:
        """Active suppressions (hashes, scopes, reasons, times), of one recipient when given."""
        keys = self._keys(recipient) if recipient is not None else None
        with self.sessions() as session:
            return suppressions.active(session, account=self.settings.account, keys=keys, limit=limit,
                                       after=after)

    def import_rows(self, rows: Iterable[dict[str, str]]) -> ImportReport:
        """Suppress many at once (an import from another system): each row names a recipient and,
        optionally, a channel and a category. All or nothing: a bad row (named by its number)
        stops the import before anything is stored."""
        entries: list[tuple[str, str, str]] = []
        count = 0
        for number, row in enumerate(rows, start=2):  # row 1 is the header
            count += 1
            try:
                recipient = recipient_of({name: row[name] for name in ("identifier", "phone_number", "email")
                                          if (row.get(name) or "").strip()})
                scope = scope_of((row.get("channel") or "").strip() or None, (row.get("category") or "").strip() or None)
            except InvalidEvent as error:
                raise InvalidEvent(f"row {number}: {error.field}", error.problem) from None
            entries.extend((key, scope.channel, scope.category) for key in recipient.keys(key=self.settings.hashing_key))
        now = utcnow()
        with self.sessions.begin() as session:
            added = sum(suppressions.suppress_many(session, account=self.settings.account, entries=chunk, now=now)
                        for chunk in _chunks(entries))
        return ImportReport(rows=count, added=added)

    def import_csv(self, path: str) -> ImportReport:
        """A CSV file with a header naming any of identifier, phone_number, email, channel, category."""
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            known = {"identifier", "phone_number", "email", "channel", "category"}
            header = set(reader.fieldnames or [])
            if not header & {"identifier", "phone_number", "email"} or header - known:
                raise InvalidEvent("header", "name columns among identifier, phone_number, email, channel, category "
                                             "(at least one of the first three)")
            return self.import_rows(reader)


def _chunks(entries: list[tuple[str, str, str]]) -> Iterator[list[tuple[str, str, str]]]:
    unique = list(dict.fromkeys(entries))
    for start in range(0, len(unique), IMPORT_CHUNK):
        yield unique[start:start + IMPORT_CHUNK]
