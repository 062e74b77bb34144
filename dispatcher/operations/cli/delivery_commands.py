"""``dispatcher deliveries``: the webhook deliveries the consumer set aside, and what to do with them.

A delivery is set aside when the consumer could not apply it within ``delivery_max_tries`` (an
event it cannot read, a conversation that keeps failing): the others go on, and reconciliation
still reads its message's state back. An operator lists them (IDs and the last error's class,
never content), retries them after fixing the cause, or drops them for good.
"""

from __future__ import annotations

import json

import click
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.operations.cli import exits
from dispatcher.settings import load_settings
from dispatcher.store import queries as store
from dispatcher.store.db import stored_sessions


@click.group("deliveries")
def deliveries_group() -> None:
    """Webhook deliveries the outcome consumer set aside."""


def _sessions() -> sessionmaker[Session]:
    return stored_sessions(load_settings().database_url)


@deliveries_group.command("list")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000), help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def list_deliveries_command(limit: int, as_json: bool) -> None:
    """List the deliveries set aside: row ID, delivery ID, event, received, tries, last error.

    \b
    Examples:
      dispatcher deliveries list
      dispatcher deliveries list --json
    """
    with _sessions()() as session:
        rows = store.set_aside_deliveries(session, limit=limit)
    if as_json:
        for row in rows:
            click.echo(json.dumps({"row": row.row_id, "delivery_id": row.delivery_id, "event": row.event,
                                   "received_at": row.received_at.isoformat(), "tries": row.tries,
                                   "last_error": row.last_error}))
        return
    if not rows:
        click.echo("no delivery is set aside")
        return
    click.echo(f"{'row':>8}  {'event':<16} {'received (UTC)':<19}  {'tries':>5}  {'last error':<20} delivery")
    for row in rows:
        click.echo(f"{row.row_id:>8}  {row.event:<16} {row.received_at:%Y-%m-%d %H:%M:%S}  {row.tries:>5}  "
                   f"{row.last_error or '-':<20} {row.delivery_id}")


@deliveries_group.command("retry")
@click.argument("row_ids", nargs=-1, required=True, type=click.IntRange(min=1))
def retry_deliveries_command(row_ids: tuple[int, ...]) -> None:
    """Try set-aside deliveries again, with fresh tries (the tracking sweep publishes them).

    \b
    Example:
      dispatcher deliveries retry 4711 4712
    """
    with _sessions().begin() as session:
        retried = store.retry_set_aside(session, row_ids)
    _report("retried", row_ids, retried)


@deliveries_group.command("drop")
@click.argument("row_ids", nargs=-1, required=True, type=click.IntRange(min=1))
def drop_deliveries_command(row_ids: tuple[int, ...]) -> None:
    """Give set-aside deliveries up for good (recorded as dropped by an operator).

    \b
    Example:
      dispatcher deliveries drop 4711
    """
    with _sessions().begin() as session:
        dropped = store.drop_set_aside(session, row_ids)
    _report("dropped", row_ids, dropped)


def _report(done: str, asked: tuple[int, ...], changed: list[int]) -> None:
    click.echo(f"{done}: {', '.join(map(str, sorted(changed))) or 'none'}")
    missing = sorted(set(asked) - set(changed))
    if missing:
        click.echo(f"error: not set aside (or no such row): {', '.join(map(str, missing))}", err=True)
        raise SystemExit(exits.FAILED)
