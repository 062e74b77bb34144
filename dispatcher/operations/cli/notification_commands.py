"""``dispatcher notify``, ``status``, ``cancel``, ``reschedule``, ``retry``, ``list`` and ``db upgrade``:
the store from the command line."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING

import click

from dispatcher.errors import InvalidEvent, TooLate
from dispatcher.lifecycle.states import NotificationState
from dispatcher.operations.cli import exits
from dispatcher.operations.since import parse_since
from dispatcher.store.record import NotificationRecord

if TYPE_CHECKING:
    from dispatcher.service import Dispatcher


def _dispatcher(*, stored: bool = True) -> Dispatcher:
    """The configured dispatcher. ``stored``: the command reads or changes what is stored, so an
    embedded store that does not exist is a wrong path, said in one line, not a new empty file."""
    from dispatcher.service import default_dispatcher

    return default_dispatcher(stored=stored)


@click.command("notify")
@click.option("--file", "-f", "source", type=click.File("rb"), required=True, help="A JSON request, or - for stdin.")
@click.option("--priority", type=click.Choice(["urgent", "normal"]), default=None,
              help="Its lane, in place of the request's own (absent: the request's, else its route's).")
def notify_command(source: IO[bytes], priority: str | None) -> None:
    """Hand over one notification request (JSON); print its event_id and state as JSON.

    The same event handed over again prints the stored notification; a different request
    under the same event_id is refused. A bad request names the field and stores nothing.
    An urgent one goes first (docs/priorities.md).

    \b
    Examples:
      dispatcher notify --file reminder.json
      dispatcher notify --file code.json --priority urgent
      echo '{"event_id": "appt-42", ...}' | dispatcher notify --file -
    """
    body = source.read()
    if priority is not None:
        body = _with_priority(body, priority)
    record = _dispatcher(stored=False).notify(body)  # the first hand-over makes the embedded store
    click.echo(json.dumps({"event_id": record.event_id, "state": record.state}))


def _with_priority(body: bytes, priority: str) -> bytes:
    """The request with its ``priority`` set; a body that is no JSON object is left for intake to refuse."""
    try:
        request = json.loads(body)
    except ValueError:
        return body
    if not isinstance(request, dict):
        return body
    return json.dumps({**request, "priority": priority}).encode()


@click.command("status")
@click.argument("event_id")
@click.option("--json", "as_json", is_flag=True, help="Print the whole record as JSON.")
def status_command(event_id: str, as_json: bool) -> None:
    """Show what became of one notification.

    \b
    Examples:
      dispatcher status appt-42
      dispatcher status appt-42 --json
    """
    record = _dispatcher().status(event_id)
    if as_json:
        click.echo(record.model_dump_json(indent=2))
        return
    _print_record(record)


def _print_record(record: NotificationRecord) -> None:
    rows = [
        ("event", record.event_id), ("state", record.state), ("route", record.route),
        ("channel", record.channel or "-"), ("inbox", record.inbox_id or "-"),
        ("conversation", record.conversation_id or "-"), ("message", record.message_id or "-"),
        ("accepted at", record.accepted_at.isoformat() if record.accepted_at else "-"),
        ("delivery", record.delivery_state or "-"),
        ("error", f"{record.error_kind}: {record.error_detail}" if record.error_kind else "-"),
        ("fallback", f"{record.fallback_decision} ({record.fallback_reason})" if record.fallback_decision else "-"),
    ]
    for label, value in rows:
        click.echo(f"{label:<13} {value}")
    for attempt in record.attempts:
        click.echo(
            f"attempt {attempt.number}: {attempt.route} ({attempt.channel}) {attempt.state}"
            f" message={attempt.message_id or '-'} tries={attempt.tries}"
            + (f" error={attempt.error_kind}" if attempt.error_kind else "")
        )


@click.command("cancel")
@click.argument("event_id")
def cancel_command(event_id: str) -> None:
    """Cancel a notification that is not sent yet: nothing of it is sent once this prints cancelled.

    Exit code 0 when it is cancelled (also when it was already), 1 when it is too late (a worker
    has it, or it has ended; its state is printed) or there is no such notification.

    \b
    Examples:
      dispatcher cancel appt-42
    """
    try:
        record = _dispatcher().cancel(event_id)
    except TooLate as late:
        click.echo(f"{event_id}: too late to cancel: it is {late.state}", err=True)
        sys.exit(exits.FAILED)
    click.echo(f"{record.event_id}: {record.state}")


@click.command("reschedule")
@click.argument("event_id")
@click.argument("send_at")
def reschedule_command(event_id: str, send_at: str) -> None:
    """Move a scheduled notification to SEND_AT (ISO 8601 with a time zone, in the future).

    Exit code 0 when it is moved, 1 when it is no longer scheduled (its state is printed) or there
    is no such notification, 2 for a time that is not one.

    \b
    Examples:
      dispatcher reschedule appt-42 2026-12-01T09:00:00+01:00
    """
    try:
        when = datetime.fromisoformat(send_at)
    except ValueError:
        raise InvalidEvent("send_at", "is not an ISO 8601 time (for example 2026-12-01T09:00:00+01:00)") from None
    try:
        record = _dispatcher().reschedule(event_id, when)
    except TooLate as late:
        click.echo(f"{event_id}: too late to reschedule: it is {late.state}", err=True)
        sys.exit(exits.FAILED)
    assert record.send_at is not None
    click.echo(f"{record.event_id}: {record.state} for {record.send_at.isoformat()}")


@click.command("retry")
@click.argument("event_id")
@click.option("--file", "-f", "source", type=click.File("rb"),
              help="The request it was handed over with (JSON, or - for stdin): a failed notification's content "
                   "was deleted when it failed.")
def retry_command(event_id: str, source: IO[bytes] | None) -> None:
    """Run a notification again: a failed one, or one set aside as crash_loop.

    A failed notification gets one new attempt on its route, the same event; its fallback
    decision stays made, so no second fallback follows. Its content was deleted when it failed:
    give the same request with --file. A notification set aside (its send task kept dying) runs
    again from where it was: fix the cause first (the worker's log says why it died); its next
    run looks for a message the dying runs may have sent before it sends anything. Exit code 1
    when it is neither, or does not exist; 2 when the request is not the one handed over.

    \b
    Examples:
      dispatcher list --state failed
      dispatcher retry appt-42 --file reminder.json
      dispatcher retry appt-43
    """
    record = _dispatcher().retry(event_id, source.read() if source is not None else None)
    click.echo(f"{record.event_id}: retried; it is {record.state}, and a worker takes it within seconds")


class SinceParam(click.ParamType):  # type: ignore[type-arg]  # generic in click 8.2 only
    name = "since"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_since(str(value), now=datetime.now(UTC))
        except ValueError as problem:
            self.fail(str(problem), param, ctx)


@click.command("list")
@click.option("--state", type=click.Choice([state.value for state in NotificationState]), help="Only this state.")
@click.option("--route", help="Only this route.")
@click.option("--workspace", help="Only this workspace (default: every one).")
@click.option("--error", "error_kind", help="Only this error kind (auth, send_deadline, quiet_hours, ...).")
@click.option("--since", type=SinceParam(),
              help="Only those created since: an ISO time (UTC unless it has an offset), or hours back (24h).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="At most this many.")
@click.option("--before", "before", type=click.IntRange(1, 2 ** 63 - 1),
              help="The next page: the cursor the last page printed.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line (no header, no cursor line).")
def list_command(state: str | None, route: str | None, workspace: str | None, error_kind: str | None,
                 since: datetime | None, limit: int, before: int | None, as_json: bool) -> None:
    """List notifications, newest first: event, workspace, state, route, channel, message,
    error kind, and when each was created and last changed (UTC). Never content or contact data.

    \b
    Examples:
      dispatcher list
      dispatcher list --state failed --since 2026-11-26 --limit 20
      dispatcher list --route reminders --json
      dispatcher list --before 4711          # the next page
    """
    from dispatcher.store import queries as store
    from dispatcher.store.record import NotificationSummary

    filters = store.NotificationFilter(state=state, route=route, workspace=workspace, error_kind=error_kind,
                                       since=since, before_id=before)
    with _dispatcher().sessions() as session:
        rows = [NotificationSummary.of(row) for row in store.recent_notifications(session, filters=filters, limit=limit)]
    if as_json:
        for row in rows:
            click.echo(row.model_dump_json())
        return
    if not rows:
        click.echo("no notifications", err=True)
        return
    click.echo(f"{'event':<32} {'workspace':<10} {'state':<12} {'route':<14} {'channel':<18} {'message':>8} "
               f"{'error':<16} {'created (UTC)':<19} {'updated (UTC)':<19}")
    for row in rows:
        click.echo(f"{row.event_id:<32} {row.workspace:<10} {row.state:<12} {row.route:<14} {row.channel or '-':<18} "
                   f"{row.message_id or '-':>8} {row.error_kind or '-':<16} {row.created_at:%Y-%m-%d %H:%M:%S} "
                   f"{row.updated_at:%Y-%m-%d %H:%M:%S}")
    if len(rows) == limit:
        click.echo(f"next page: --before {rows[-1].cursor}", err=True)


@click.group("db")
def db_group() -> None:
    """The dispatcher's database."""


@db_group.command("upgrade")
def db_upgrade_command() -> None:
    """Create or upgrade the tables (Alembic); safe to run again.

    \b
    Example:
      DISPATCHER_DATABASE_URL=postgresql+psycopg://dispatcher@db/dispatcher dispatcher db upgrade
    """
    from dispatcher.settings import load_settings
    from dispatcher.store.migrate import upgrade_database

    upgrade_database(load_settings().database_url)
    click.echo("database is at the newest schema")
