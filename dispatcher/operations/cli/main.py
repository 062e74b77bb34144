"""``dispatcher``: the entry point, the command list, and how errors end a command.

An error an operator can cause ends the command with one line and an exit status by its kind
(:mod:`dispatcher.operations.cli.exits`; docs/operations.md lists them), never a traceback.
"""

from __future__ import annotations

import sys

import click

from dispatcher.operations.cli import exits
from dispatcher.operations.cli.callback_commands import callbacks_group
from dispatcher.operations.cli.config_commands import config_group, inboxes_command
from dispatcher.operations.cli.dashboard_command import dashboard_command
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


class _Dispatcher(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except Exception as error:
            ending = exits.status_and_line(error)
            if ending is None:
                raise
            status, line = ending
            click.echo(line, err=True)
            sys.exit(status)


@click.group(cls=_Dispatcher, context_settings={"help_option_names": ["-h", "--help"]}, epilog=exits.STATUSES)
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
                suppressions_group, callbacks_group, flower_command, dashboard_command):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="dispatcher")
