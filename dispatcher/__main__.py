"""``python -m dispatcher`` is the ``dispatcher`` command."""

from dispatcher.cli import main

main()
