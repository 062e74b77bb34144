"""Crash points: the named places where a process may die, for the deterministic simulation.

The store calls :func:`crash_point` around every commit and the API client around every request
to the workspace. In production no hook is installed and a point costs a call and one global read. The
simulation (tests/simulation/) installs a hook that may stop the process there (by raising an
exception that no code of ours catches, so the transaction in flight is discarded and the run's
memory is lost) or hand control to another simulated process, so that every order of steps
between processes can be tried. docs/simulation.md lists the points.
"""

from __future__ import annotations

from collections.abc import Callable

Hook = Callable[[str, bool], None]

_hook: Hook | None = None


def crash_point(site: str, operation: str = "", *, in_transaction: bool = False) -> None:
    """A process may die here (``site``, and the API ``operation`` when there is one: the name is
    only put together when a hook listens). ``in_transaction``: a store transaction is open (a
    crash there discards it, and no other process may run until it ends)."""
    if _hook is not None:
        _hook(f"{site} {operation}" if operation else site, in_transaction)


def install(hook: Hook | None) -> Hook | None:
    """Set the hook (None removes it); returns the one it replaces."""
    global _hook
    previous, _hook = _hook, hook
    return previous
