"""Which simulation seeds to add to the mutation selection: the branches each seed takes in the
mutated modules, then a greedy pick of the seeds that take the most branches the selection does not.

mutmut maps tests to the functions they reach, not to lines: a seed kills a mutant only if it takes
the mutated branch, so the selection is widened by the branches it takes (docs/simulation.md,
"Choosing the seeds"). Usage, from the repository's root:

    .venv/bin/python scripts/mutation_seeds.py --seeds 0-23 --gain 8

It runs each seed of every random world under coverage (about a second a seed, over every core) and
prints, in the order picked, each seed that adds at least ``--gain`` branches, with the total.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The modules mutmut mutates, as pyproject.toml names them: when the send path became four modules,
# a list kept here went on measuring three, and no seed was picked for the new modules' branches.
MUTATED = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"])
RANDOM_WORLDS = ("small", "contention", "refusals", "opt-outs", "crash-loop", "cancels", "schedules", "lost-answers",
                 "unreadable-answers",
                 "redeliveries", "provider-refusals", "outage", "retries", "quiet-hours", "publish-refusals", "contract",
                 "front-desk-contacts", "removed-inbox", "traced", "batches", "withdrawn-template", "shared-patients")

Seed = tuple[str, int]


def branches_of(seed: Seed) -> tuple[Seed, bool, frozenset[str]]:
    """The branches (coverage's arcs) of the mutated modules that one seed's run takes, as the
    selection's test runs it, and whether the run kept every promise."""
    import coverage

    from tests.simulation.runner import WORLDS, run

    world, number = seed
    measure = coverage.Coverage(branch=True, include=[str(ROOT / path) for path in MUTATED], data_file=None)
    measure.start()
    try:
        quick = replace(WORLDS[world], max_steps=3_000)  # as test_quick_worlds runs it
        outcome = run(quick, seed=number, keep_trace=False)
    finally:
        measure.stop()
    data = measure.get_data()
    taken = frozenset(f"{os.path.relpath(path, ROOT)}:{start}>{end}"
                      for path in data.measured_files() for start, end in data.arcs(path) or ())
    return seed, outcome.ok, taken


def greedy(taken: dict[Seed, frozenset[str]], chosen: list[Seed], gain: int) -> list[tuple[Seed, int, int]]:
    """Seeds added one at a time, each the one that adds the most branches: (seed, added, total)."""
    covered = set().union(*(taken[seed] for seed in chosen if seed in taken))
    picked: list[tuple[Seed, int, int]] = []
    candidates = {seed: branches for seed, branches in taken.items() if seed not in chosen}
    while candidates:
        seed, branches = max(candidates.items(), key=lambda item: (len(item[1] - covered), item[0]))
        added = len(branches - covered)
        if added < gain:
            break
        covered |= branches
        del candidates[seed]
        picked.append((seed, added, len(covered)))
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-23", help="a range of seeds of every random world (default 0-23)")
    parser.add_argument("--gain", type=int, default=8, help="the fewest new branches a seed must add (default 8)")
    parser.add_argument("--worlds", default=",".join(RANDOM_WORLDS),
                        help="the worlds whose seeds are tried, comma-separated (default: every random world)")
    args = parser.parse_args(argv)
    from tests.simulation.test_simulation import MUTATION_WORLDS

    selection: list[Seed] = [(world, number) for world, number in MUTATION_WORLDS]
    first, _, last = args.seeds.partition("-")
    worlds = [world for world in args.worlds.split(",") if world]
    if unknown := sorted(set(worlds) - set(RANDOM_WORLDS)):
        parser.error(f"--worlds: no random world {unknown[0]!r} (one of: {', '.join(RANDOM_WORLDS)})")
    seeds = sorted({(world, number) for world in worlds for number in range(int(first), int(last or first) + 1)}
                   | set(selection))  # the selection's own seeds are measured too, whatever their numbers
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        results = list(pool.map(branches_of, seeds))
    failing = [seed for seed, ok, _ in results if not ok]
    taken = {seed: branches for seed, ok, branches in results if ok}
    before = len(set().union(*(taken[seed] for seed in selection if seed in taken)))
    print(f"{len(results)} seeds take {len(set().union(*taken.values()))} branches of the mutated modules; "
          f"the selection's {len(selection)} seeds take {before}")
    for (world, number), added, total in greedy(taken, selection, args.gain):
        print(f"  ({world!r}, {number}): +{added} -> {total}")
    for world, number in failing:
        print(f"  seed {number} of {world} broke a promise: python -m tests.simulation --world {world} --seed {number}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
