"""``dispatcher demo``: the README's first command."""

from __future__ import annotations

import sys

import click


@click.command("demo")
def demo_command() -> None:
    """Run the demo on embedded defaults: no servers to install.

    Starts the sandbox (a stock workspace's double) and the dispatcher's processes as children,
    sends sample appointment reminders through the contract's steps, lets a patient write back,
    waits for the delivery states, prints a table of the final states and exits 0 when every
    state is the expected one (1 otherwise). It keeps its store, broker and the sandbox's data
    in var/demo/ under the current directory: a second run sends again to the same patients and
    must end the same way. Delete var/demo/ to start over.

    \b
    Example:
      dispatcher demo
    """
    from dispatcher.operations.demo import run_demo  # imported late: --help stays fast

    sys.exit(run_demo(sys.stdout))
