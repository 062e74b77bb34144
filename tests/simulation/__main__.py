"""Run simulated worlds from the command line (docs/simulation.md).

    python -m tests.simulation --seeds 0-1999                # many seeds, over every core
    python -m tests.simulation --seed 17 --trace             # replay one seed, step by step
    python -m tests.simulation --seed 17 --shrink            # and shrink it to the shortest failing run
    python -m tests.simulation --choices 0,3,0,1 --trace     # replay a shrunk run from its choices
    python -m tests.simulation --world large --seeds 0-99    # 100 notifications, 50 faults
    python -m tests.simulation --world exhaustive --explore  # every schedule of a small world, each state once

Exit code 0 when every run kept every promise, 1 when one did not (its seed and trace are shown), 2 when
the postgresql world's server does not answer.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from tests.simulation import stores
from tests.simulation.explore import explore
from tests.simulation.runner import WORLDS, run, shrink


def _seed_range(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def _one(args: tuple[str, int]) -> tuple[int, list[str], int, float]:
    logging.disable(logging.CRITICAL)
    world, seed = args
    outcome = run(WORLDS[world], seed=seed, keep_trace=False)
    return seed, [f"{v.invariant}: {v.detail}" for v in outcome.violations], outcome.steps, outcome.simulated_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__.split("\n")[0])
    parser.add_argument("--world", choices=sorted(WORLDS), default="small")
    parser.add_argument("--seed", type=int, help="run one seed")
    parser.add_argument("--seeds", type=_seed_range, help="run a range of seeds, FIRST-LAST")
    parser.add_argument("--choices", help="replay a run from its comma-separated choices (as --shrink prints them)")
    parser.add_argument("--trace", action="store_true", help="print the run's steps")
    parser.add_argument("--shrink", action="store_true", help="shrink a failing run to its shortest trace")
    parser.add_argument("--explore", action="store_true", help="explore every schedule of the world (exhaustive worlds)")
    parser.add_argument("--depth", type=int, default=80, help="--explore: the most choices in one schedule")
    parser.add_argument("--max-runs", type=int, default=1_000_000, help="--explore: stop after this many runs")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes for --seeds (default: every core)")
    options = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the real code logs its waits and pauses: the trace says it better
    spec = WORLDS[options.world]
    if spec.store == "postgresql" and (trouble := stores.postgres_answers()) is not None:
        print(f"{options.world}: {trouble} (scripts/test starts it; docs/simulation.md)", file=sys.stderr)
        return 2
    if options.explore:
        started = time.perf_counter()
        report = explore(spec, depth=options.depth, max_runs=options.max_runs)
        complete = "complete" if report.transitions < options.max_runs and not report.at_depth else "bounded"
        print(f"{options.world}: {report.states} states, {report.transitions} transitions ({report.revisits} into a "
              f"state already explored), {report.complete_runs} schedules run to their end, {report.at_depth} cut at "
              f"depth {options.depth}: {complete}, in {time.perf_counter() - started:.0f} s")
        for choices, failure in report.failures:
            print(f"VIOLATED {failure}; replay: --world {options.world} --choices {','.join(map(str, choices))} --trace")
        return 1 if report.failures else 0
    if options.seeds is not None:
        started = time.perf_counter()
        failed = 0
        with ProcessPoolExecutor(max_workers=options.jobs) as pool:
            for seed, violations, _steps, _simulated in pool.map(_one, [(options.world, s) for s in options.seeds],
                                                                  chunksize=8):
                if violations:
                    failed += 1
                    print(f"seed {seed}: {violations[0]}")
        elapsed = time.perf_counter() - started
        count = len(options.seeds)
        print(f"{count} seeds of the {options.world} world in {elapsed:.1f} s: {count / elapsed:.1f} seeds/s over "
              f"{options.jobs} processes ({count / elapsed / options.jobs:.1f} per core); {failed} failed")
        return 1 if failed else 0
    if options.seed is None and options.choices is None:
        parser.error("give --seed, --seeds or --choices")
    script = [int(c) for c in options.choices.split(",") if c] if options.choices is not None else None
    started = time.perf_counter()
    outcome = run(spec, seed=options.seed, script=script)
    elapsed = time.perf_counter() - started
    if options.trace or not outcome.ok:
        print("\n".join(outcome.trace))
    print(f"{outcome.steps} steps, {outcome.simulated_s:.0f} s simulated, {outcome.faults_used} faults, "
          f"{elapsed * 1000:.0f} ms; ends: {outcome.ends}")
    for violation in outcome.violations:
        print(f"VIOLATED {violation.invariant}: {violation.detail}")
    if outcome.violations and options.shrink:
        first = outcome.violations[0].invariant
        shortest = shrink(spec, outcome.choices, lambda o: any(v.invariant == first for v in o.violations))
        replayed = run(spec, script=shortest)
        print("\nshrunk to:")
        print("\n".join(replayed.trace))
        for violation in replayed.violations:
            print(f"VIOLATED {violation.invariant}: {violation.detail}")
        print(f"\nreplay: python -m tests.simulation --world {options.world} --choices {','.join(map(str, shortest))} --trace")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
