"""``python -m dispatcher`` is the ``dispatcher`` command."""

from dispatcher.operations.cli import main

main()
