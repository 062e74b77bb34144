"""CPU milliseconds a seed of the deterministic simulation, in this one process (docs/simulation.md).

Three seeds warm the process (SQLAlchemy's statement cache, imports), then ``--seeds`` seeds of
``--world`` are run one after the other and timed with ``time.process_time``: what a seed costs a
core, the figure behind how many seeds the README's test command can afford (issue 46's goal: 40 ms,
on the way to 20).

    .venv/bin/python scripts/bench/simulation_seed.py --world small --seeds 40

Prints JSON: the world, the seeds timed, CPU ms per seed, and the first failing seed if any (a
benchmark of a failing run would measure something else).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's root: tests.simulation

from tests.simulation.runner import WORLDS, run  # noqa: E402

WARM_UP_SEEDS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", choices=sorted(WORLDS), default="small")
    parser.add_argument("--seeds", type=int, default=40, help="seeds timed, after the warm-up")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    for seed in range(WARM_UP_SEEDS):
        run(WORLDS[args.world], seed=seed, keep_trace=False)
    failing = None
    started = time.process_time()
    for seed in range(WARM_UP_SEEDS, WARM_UP_SEEDS + args.seeds):
        if not run(WORLDS[args.world], seed=seed, keep_trace=False).ok and failing is None:
            failing = seed
    spent = time.process_time() - started
    print(json.dumps({"benchmark": "simulation CPU a seed", "world": args.world, "seeds": args.seeds,
                      "cpu_ms_per_seed": round(spent / args.seeds * 1000, 1), "failing_seed": failing,
                      "goal_ms": 40}, indent=2))


if __name__ == "__main__":
    main()
