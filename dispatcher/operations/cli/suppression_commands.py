"""``dispatcher suppressions add|remove|list|import``: the suppression list from the command line.

A recipient is named by ``--identifier``, ``--phone`` or ``--email``; nothing printed repeats it:
``list`` shows keyed hashes, scopes, reasons and times (docs/opt-outs.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from dispatcher.service import Dispatcher


def _dispatcher(*, stored: bool = True) -> Dispatcher:
    """The configured dispatcher; ``stored``: the command reads what is stored, so a missing
    embedded store is a wrong path (adding an opt-out may make it, as a first hand-over does)."""
    from dispatcher.service import default_dispatcher

    return default_dispatcher(stored=stored)


def _recipient(identifier: str | None, phone: str | None, email: str | None) -> dict[str, Any]:
    return {name: value for name, value in (("identifier", identifier), ("phone_number", phone), ("email", email))
            if value is not None}


F = TypeVar("F", bound=Callable[..., Any])
_who = [
    click.option("--identifier", help="The host's contact identifier."),
    click.option("--phone", help="A phone number in E.164 form (+15551234567)."),
    click.option("--email", help="An e-mail address."),
]
_scope = [
    click.option("--channel", default="*", show_default=True,
                 help="sms, messaging_platform, web_session, email, other, or * for every channel."),
    click.option("--category", default="*", show_default=True, help="A category such as marketing, or * for all."),
]


def _options(options: list[Any]) -> Callable[[F], F]:
    def wrap(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command
    return wrap


@click.group("suppressions")
def suppressions_group() -> None:
    """Opt-outs: who must not be messaged, on which channel and category.

    \b
    Examples:
      dispatcher suppressions add --phone +15551234567 --channel sms
      dispatcher suppressions remove --phone +15551234567 --channel sms
      dispatcher suppressions list --phone +15551234567
      dispatcher suppressions import opt-outs.csv
    """


@suppressions_group.command("add")
@_options(_who + _scope)
def add_command(identifier: str | None, phone: str | None, email: str | None, channel: str, category: str) -> None:
    """Opt a recipient out; notifications already waiting for it are not sent either.

    \b
    Examples:
      dispatcher suppressions add --phone +15551234567 --channel sms
      dispatcher suppressions add --identifier patient-42 --category marketing
    """
    added = _dispatcher(stored=False).suppress(_recipient(identifier, phone, email), channel=channel, category=category)
    click.echo(json.dumps({"added": added}))


@suppressions_group.command("remove")
@_options(_who + _scope)
def remove_command(identifier: str | None, phone: str | None, email: str | None, channel: str, category: str) -> None:
    """Lift the opt-out recorded in exactly this scope.

    \b
    Examples:
      dispatcher suppressions remove --phone +15551234567 --channel sms
    """
    lifted = _dispatcher().unsuppress(_recipient(identifier, phone, email), channel=channel, category=category)
    click.echo(json.dumps({"lifted": lifted}))


@suppressions_group.command("list")
@_options(_who)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def list_command(identifier: str | None, phone: str | None, email: str | None, limit: int, as_json: bool) -> None:
    """Active opt-outs (of one recipient when named): key hash, channel, category, reason, since.

    \b
    Examples:
      dispatcher suppressions list
      dispatcher suppressions list --phone +15551234567 --json
    """
    recipient = _recipient(identifier, phone, email) or None
    records = _dispatcher().recipients.list(recipient, limit=limit)
    if as_json:
        for record in records:
            click.echo(json.dumps({"recipient_key": record.recipient_key, "channel": record.channel,
                                   "category": record.category, "reason": record.reason,
                                   "since": record.since.isoformat()}))
        return
    click.echo(f"{'RECIPIENT KEY':<18} {'CHANNEL':<20} {'CATEGORY':<12} {'REASON':<18} SINCE")
    for record in records:
        click.echo(f"{record.recipient_key[:16] + '..':<18} {record.channel:<20} {record.category:<12} "
                   f"{record.reason:<18} {record.since.isoformat(timespec='seconds')}")


@suppressions_group.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
def import_command(path: str) -> None:
    """Opt out every recipient of a CSV file (header: any of identifier, phone_number, email, and
    optionally channel, category). All or nothing: a bad row is named and nothing is stored.

    \b
    Examples:
      dispatcher suppressions import opt-outs.csv
    """
    began = time.monotonic()
    report = _dispatcher(stored=False).recipients.import_csv(path)
    click.echo(json.dumps({"rows": report.rows, "added": report.added,
                           "seconds": round(time.monotonic() - began, 2)}))
