"""``dispatcher``: the entry point, the command list, and how errors end a command.

Any :class:`~dispatcher.errors.DispatcherError` ends the command with its message (which names
the key or field at fault and never carries a secret) and exit status 2, instead of a traceback;
a database error ends it with one line naming the error's class, and exit status 3
(docs/operations.md lists the statuses).
"""

from __future__ import annotations

import sys

import click
from sqlalchemy.exc import SQLAlchemyError

from dispatcher.errors import DispatcherError
from dispatcher.operations.cli.callback_commands import callbacks_group
from dispatcher.operations.cli.config_commands import config_group, inboxes_command
from dispatcher.operations.cli.delivery_commands import deliveries_group
from dispatcher.operations.cli.demo_command import demo_command
from dispatcher.operations.cli.flower_command import flower_command
from dispatcher.operations.cli.notification_commands import (
    cancel_command,
    db_group,
    list_command,
    notify_command,
    reschedule_command,
    retry_command,
    status_command,
)
from dispatcher.operations.cli.process_commands import beat_command, consumer_command, sandbox_command, worker_command
from dispatcher.operations.cli.suppression_commands import suppressions_group
from dispatcher.operations.cli.webhook_commands import receiver_command, webhooks_group

EXIT_USAGE = 2


EXIT_STORE = 3


class _Dispatcher(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except DispatcherError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_USAGE)
        except SQLAlchemyError as error:
            # One line, the error's class only: a driver's message may quote the statement's text.
            click.echo(f"error: the database failed the command ({type(error).__name__}); run it again once it "
                       "answers (the same event is never stored twice)", err=True)
            sys.exit(EXIT_STORE)


@click.group(cls=_Dispatcher, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="notification-dispatcher", prog_name="dispatcher")
def cli() -> None:
    """Send business notifications through a messaging workspace, durably and once.

    Settings come from DISPATCHER_* environment variables and the TOML file named by
    DISPATCHER_CONFIG (see config/dispatcher.example.toml).

    \b
    Examples:
      dispatcher demo
      DISPATCHER_CONFIG=config/dispatcher.example.toml dispatcher config check
      dispatcher sandbox --host 127.0.0.1 --port 3000
    """


cli.add_command(demo_command)
cli.add_command(sandbox_command)
cli.add_command(config_group)
cli.add_command(inboxes_command)
for command in (notify_command, status_command, cancel_command, reschedule_command, retry_command, list_command, db_group,
                worker_command, consumer_command, beat_command, receiver_command, webhooks_group, deliveries_group,
                suppressions_group, callbacks_group, flower_command):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="dispatcher")
