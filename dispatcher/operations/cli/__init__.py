"""The ``dispatcher`` command line. Each sub-module holds one group of commands."""

from dispatcher.operations.cli.main import main

__all__ = ["main"]
