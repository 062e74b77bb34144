"""Exhaustive small worlds: every schedule to a depth, each state visited once.

A depth-first search over the runs' choices. A node of the search is a list of choices; it is run
strictly (the real code, from the start, stopping where the list ends), which yields the state
reached and how many options the next choice has; each option is a child. States are keyed by
:meth:`World.key` (store rows, broker, processes, workspace, with times relative to now), so a
state reached by two schedules is explored once. Runs that end, break a promise or reach the
depth are leaves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.simulation.runner import run
from tests.simulation.world import WorldSpec


@dataclass
class Exploration:
    states: int = 0  # distinct states expanded
    transitions: int = 0  # choices taken (runs made)
    revisits: int = 0  # runs that reached a state already explored
    complete_runs: int = 0  # runs that ended within the depth
    at_depth: int = 0  # runs cut at the depth
    failures: list[tuple[list[int], str]] = field(default_factory=list)


def explore(spec: WorldSpec, *, depth: int, max_runs: int = 1_000_000) -> Exploration:
    report = Exploration()
    seen: set[tuple[object, ...]] = set()
    stack: list[list[int]] = [[]]
    while stack and report.transitions < max_runs:
        prefix = stack.pop()
        outcome = run(spec, script=prefix, strict=True, keep_trace=False)
        report.transitions += 1
        if outcome.violations:
            report.failures.append((prefix, f"{outcome.violations[0].invariant}: {outcome.violations[0].detail}"))
            continue
        if outcome.frontier is None:
            report.complete_runs += 1
            continue
        assert outcome.state_key is not None
        if outcome.state_key in seen:
            report.revisits += 1
            continue
        seen.add(outcome.state_key)
        report.states += 1
        if len(prefix) >= depth:
            report.at_depth += 1
            continue
        stack.extend(prefix + [option] for option in reversed(range(outcome.frontier)))
    return report
