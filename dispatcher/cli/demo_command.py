"""``dispatcher demo``: the README's first command."""

from __future__ import annotations

import sys

import click


@click.command("demo")
def demo_command() -> None:
    """Run the demo on embedded defaults: no servers to install.

    Starts the sandbox as a child process, sends sample appointment reminders through the
    contract's steps, waits for their delivery states, prints a table of the final states and
    exits 0 when every state is the expected one (1 otherwise).

    \b
    Example:
      dispatcher demo
    """
    from dispatcher.demo import run_demo  # imported late: --help stays fast

    sys.exit(run_demo(sys.stdout))
