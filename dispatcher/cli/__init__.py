"""The ``dispatcher`` command line. Each sub-module holds one group of commands."""

from dispatcher.cli.main import main

__all__ = ["main"]
