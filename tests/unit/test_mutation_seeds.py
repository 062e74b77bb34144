"""scripts/mutation_seeds.py picks the seeds that widen the mutation selection most, greedily."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("mutation_seeds", REPO_ROOT / "scripts" / "mutation_seeds.py")
assert spec is not None and spec.loader is not None
seeds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seeds)


def test_each_pick_adds_the_most_branches_the_selection_does_not_take_until_none_adds_enough() -> None:
    taken = {
        ("small", 1): frozenset({"a", "b"}),  # in the selection already
        ("small", 2): frozenset({"a", "b", "c"}),  # one new branch
        ("outage", 1): frozenset({"c", "d", "e", "f"}),  # four new
        ("outage", 2): frozenset({"d", "e", "g"}),  # three new, then only one once outage 1 is in
    }
    assert seeds.greedy(taken, [("small", 1)], gain=2) == [(("outage", 1), 4, 6)]
    assert seeds.greedy(taken, [("small", 1)], gain=1) == [(("outage", 1), 4, 6), (("outage", 2), 1, 7)]
    assert seeds.greedy(taken, [("small", 1), ("outage", 1), ("outage", 2)], gain=1) == []


def test_the_seeds_are_picked_by_the_branches_of_every_mutated_module() -> None:
    import tomllib

    mutated = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    assert list(seeds.MUTATED) == mutated and "dispatcher/sending/claim.py" in seeds.MUTATED
