"""``dispatcher callbacks``: the host's outcome callbacks (docs/callbacks.md): list them and the
paused URLs, resume delivery after fixing the host's endpoint, replay one notification's events."""

from __future__ import annotations

import json

import click
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.operations.cli import exits
from dispatcher.settings import load_settings
from dispatcher.store import callbacks as outbox
from dispatcher.store.db import stored_sessions
from dispatcher.store.models import utcnow


@click.group("callbacks")
def callbacks_group() -> None:
    """Outcome callbacks to the host: what was told, what waits, which URL is paused."""


def _sessions() -> sessionmaker[Session]:
    return stored_sessions(load_settings().database_url)


@callbacks_group.command("list")
@click.option("--status", type=click.Choice([outbox.PENDING, outbox.DELIVERED, outbox.EXPIRED]), help="Only these.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000), help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_callbacks_command(status: str | None, limit: int, as_json: bool) -> None:
    """List callbacks, newest first (ID, event, type, sequence, status, tries, when it occurred and
    was delivered, last error), then any paused URL (by its hash: a URL may hold a token) and why.

    \b
    Examples:
      dispatcher callbacks list
      dispatcher callbacks list --status pending --json
    """
    with _sessions()() as session:
        rows = outbox.listed(session, status=status, limit=limit)
        endpoints = outbox.endpoints(session)
    if rows and not as_json:
        click.echo(f"{'webhook id':<12} {'event':<32} {'type':<24} {'seq':>4} {'status':<9} {'tries':>5} "
                   f"{'occurred (UTC)':<19} {'delivered (UTC)':<19} last error")
    for row in rows:
        fields = {"webhook_id": f"msg_{row.id}", "event_id": row.event_id, "type": row.type, "sequence": row.sequence,
                  "status": row.status, "tries": row.tries, "last_error": row.last_error,
                  "occurred_at": row.occurred_at.isoformat(),
                  "delivered_at": row.delivered_at.isoformat() if row.delivered_at else None,
                  "next_try_at": row.next_try_at.isoformat() if row.next_try_at else None}
        if as_json:
            click.echo(json.dumps(fields))
        else:
            delivered = f"{row.delivered_at:%Y-%m-%d %H:%M:%S}" if row.delivered_at else "-"
            click.echo(f"{fields['webhook_id']:<12} {row.event_id:<32} {row.type:<24} {row.sequence:>4} {row.status:<9} "
                       f"{row.tries:>5} {row.occurred_at:%Y-%m-%d %H:%M:%S} {delivered:<19} {row.last_error or '-'}")
    if not rows and not as_json:
        click.echo("no callbacks", err=True)
    for endpoint in endpoints:
        state = "paused" if endpoint.paused_at else "failing"
        line = {"url_sha256": endpoint.url_key, "state": state, "reason": endpoint.reason}
        click.echo(json.dumps(line) if as_json else f"URL {endpoint.url_key[:12]}… {state}: {endpoint.reason or '-'}")


@callbacks_group.command("retry")
def retry_callbacks_command() -> None:
    """Resume every paused URL: the callbacks held for it are due now (after fixing the host's
    endpoint). Others keep their schedule.

    \b
    Example:
      dispatcher callbacks retry
    """
    with _sessions().begin() as session:
        resumed, due = outbox.resume(session, now=utcnow())
    click.echo(f"resumed {resumed} URL(s); {due} callback(s) due now")


@callbacks_group.command("replay")
@click.argument("event_id")
def replay_callbacks_command(event_id: str) -> None:
    """Deliver every callback of one notification again, under the same webhook IDs.

    \b
    Example:
      dispatcher callbacks replay appt-42
    """
    with _sessions().begin() as session:
        replayed = outbox.replay(session, event_id, now=utcnow())
    if not replayed:  # nothing to replay: what was asked about is not there (status 1)
        click.echo(f"error: no callbacks for event_id {event_id!r}", err=True)
        raise SystemExit(exits.FAILED)
    click.echo(f"{event_id}: {replayed} callback(s) due again")
