"""Write docs/mutation-survivors.md from the last `mutmut run`: every mutant the README's test
command would pass (mypy --strict accepts it and no selected test fails), with its change, grouped
by function, and the score.

    .venv/bin/mutmut run                     # [tool.mutmut] in pyproject.toml: all ~4,000 mutants, many hours
    .venv/bin/python scripts/mutation_report.py

or, for an estimate in under an hour, a uniform sample of the mutants (the same sample for a seed):

    .venv/bin/mutmut run $(.venv/bin/python scripts/mutation_report.py --sample 240 --seed 20261126)
    .venv/bin/python scripts/mutation_report.py

Each survivor gets a kind from its change, to read the list by: ``log`` (a log line's text or
arguments), ``text`` (the words of a reason or detail), ``timing`` (a delay, backoff, pause or
lease length), ``unreached`` (no selected test runs its function), ``behaviour`` (the rest: the
ones to read first). docs/simulation.md says why each group lives.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import random
import re
import subprocess
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

MUTMUT = str(Path(sys.executable).with_name("mutmut"))

# Why a survivor lives, read from the code by hand: "function #number" -> the reason.
WHY: dict[str, str] = tomllib.loads((Path(__file__).parent / "mutation_reasons.toml").read_text())
OUT = Path("docs/mutation-survivors.md")
# mutmut's status for a mutant mypy --strict rejects ([tool.mutmut] type_check_command): the README's
# test command runs mypy before pytest, so such a mutant fails the suite without a test running.
TYPE_CHECKED = "caught by type check"
TIMING = re.compile(r"delay_s|backoff|pause_s|lease|countdown|_after_s|timedelta|interval")
STRING_ONLY = re.compile(r'"[^"]*"|\'[^\']*\'')


def results() -> dict[str, str]:
    listed = subprocess.run([MUTMUT, "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in listed.splitlines():
        name, _, status = line.strip().partition(": ")
        if name:
            found[name] = status
    return found


def functions_of(module: str) -> dict[str, list[str]]:
    """Every function of a mutated module's copy in mutants/ (the original and each mutant), by name."""
    path = Path("mutants") / (module.replace(".", "/") + ".py")
    source = path.read_text()
    lines = source.splitlines()
    return {node.name: lines[node.lineno - 1:node.end_lineno] for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name}


def change(name: str, modules: dict[str, dict[str, list[str]]]) -> tuple[list[str], list[str]]:
    """The lines a mutant changed against its function's original (what `mutmut show` prints, faster)."""
    module, _, function = name.rpartition(".")
    if module not in modules:
        modules[module] = functions_of(module)
    found = modules[module]
    original = found.get(function.rsplit("__mutmut_", 1)[0] + "__mutmut_orig", [])
    mutant = found.get(function, [])
    diff = list(difflib.unified_diff(original[1:], mutant[1:], lineterm="", n=0))
    removed = [line[1:].strip() for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff if line.startswith("+") and not line.startswith("+++")]
    return removed, added


def _around_the_change(before: str, after: str) -> str:
    """The changed part of a line, with the name it is an argument of or assigned to (to its left)."""
    parts = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before, after).get_opcodes():
        if tag != "equal":
            parts.append(before[max(i1 - 20, 0):i2 + 3] + " " + after[max(j1 - 20, 0):j2 + 3])
    return " ".join(parts)


def kind_of(status: str, removed: list[str], added: list[str]) -> str:
    if status == "no tests":
        return "unreached"
    both = " ".join(removed + added)
    if "log." in both:
        return "log"
    if [STRING_ONLY.sub("", line) for line in removed] == [STRING_ONLY.sub("", line) for line in added]:
        changed = set(STRING_ONLY.findall(" ".join(removed))) ^ set(STRING_ONLY.findall(" ".join(added)))
        if all(" " in literal for literal in changed):  # words of a reason or detail, not a value
            return "text"
    if TIMING.search(_around_the_change(" ".join(removed), " ".join(added))):
        return "timing"
    return "behaviour"


def sample(size: int, seed: int) -> list[str]:
    """``size`` mutant names drawn uniformly (by ``seed``) from every mutant of the mutated modules,
    generating the mutants with mutmut's own code when no run has made them yet."""
    if not list(Path("mutants").glob("dispatcher/**/*.meta")):
        import contextlib
        import io

        import mutmut.__main__ as mutmut_main

        with contextlib.redirect_stdout(io.StringIO()):  # mutmut reports what it copies; only the names go out
            mutmut_main.set_mutant_under_test("mutant_generation")
            Path("mutants").mkdir(exist_ok=True)
            mutmut_main.copy_src_dir()
            mutmut_main.copy_also_copy_files()
            mutmut_main.setup_source_paths()
            mutmut_main.store_lines_covered_by_tests()
            mutmut_main.create_mutants(1)
    names = sorted(name for meta in sorted(Path("mutants").glob("dispatcher/**/*.meta"))
                   for name in json.loads(meta.read_text())["exit_code_by_key"])
    return sorted(random.Random(seed).sample(names, min(size, len(names))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/mutation-survivors.md, or print a sample of mutant names.")
    parser.add_argument("--sample", type=int, help="print this many mutant names, drawn uniformly, for `mutmut run`")
    parser.add_argument("--seed", type=int, default=20261126, help="the sample's seed")
    args = parser.parse_args(argv)
    if args.sample:
        print("\n".join(sample(args.sample, args.seed)))
        return 0
    statuses = results()
    counts = Counter(statuses.values())
    killed = counts.get("killed", 0)
    typed_out = counts.get(TYPE_CHECKED, 0)
    total = len(statuses)
    checked = total - counts.get("not checked", 0)
    survivors = sorted(name for name, status in statuses.items() if status not in ("killed", TYPE_CHECKED, "not checked"))
    by_function: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)
    kinds: Counter[str] = Counter()
    modules: dict[str, dict[str, list[str]]] = {}
    for name in survivors:
        status = statuses[name]
        removed, added = change(name, modules) if status != "no tests" else ([], [])
        kind = kind_of(status, removed, added)
        kinds[kind] += 1
        function = name.rsplit("__mutmut_", 1)[0].replace(".x_", ".", 1)
        shown = " → ".join(filter(None, [" / ".join(removed)[:140], " / ".join(added)[:140]])) or "(not run)"
        number = name.rsplit("_", 1)[-1]
        by_function[function].append((number, kind, shown, WHY.get(f"{function} #{number}", "")))
    lines = [
        "# Mutants the tests do not kill",
        "",
        "Generated by `scripts/mutation_report.py` from the last `mutmut run` ([tool.mutmut] in",
        "`pyproject.toml`: the lifecycle's moves and the send and tracking steps, mutated; the",
        "simulation's `test_quick_worlds` and the in-process tests of those steps run against each,",
        "mutmut running those that reach the mutated function), after mypy --strict, which the README's",
        "test command runs first (`type_check_command`). Why each lives, read from the code by hand:",
        "`scripts/mutation_reasons.toml`, shown beside each; by group: docs/simulation.md.",
        "",
        f"**{killed + typed_out} of {checked} mutants checked fail the test command "
        f"({100 * (killed + typed_out) / max(checked, 1):.1f} %)**: mypy --strict rejects {typed_out}, "
        f"the tests kill {killed} of the {checked - typed_out} that type-check "
        f"({100 * killed / max(checked - typed_out, 1):.1f} %)"
        + (f" (all {total} were checked). " if not counts.get("not checked") else
           f"; {total - checked} of the {total} were not checked (a sample, or a run stopped before the end: "
           "`mutmut run` carries on). ")
        + ", ".join(f"{status}: {n}" for status, n in sorted(counts.items())) + ".",
        "",
        "Survivors by kind: " + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()) + ".",
        "",
        "| Function | Survivors | By kind |",
        "| --- | --- | --- |",
    ]
    for function, rows in sorted(by_function.items(), key=lambda item: -len(item[1])):
        per_kind = Counter(kind for _, kind, _, _ in rows)
        lines.append(f"| `{function}` | {len(rows)} | " + ", ".join(f"{k} {n}" for k, n in per_kind.most_common()) + " |")
    for function, rows in sorted(by_function.items()):
        lines += ["", f"## `{function}`", "", "| # | Kind | Change | Why it lives |", "| --- | --- | --- | --- |"]
        for number, kind, shown, why in rows:
            lines.append(f"| {number} | {kind} | `{shown.replace('|', '¦').replace('`', '')}` | {why} |")
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{killed + typed_out} of {checked} checked fail the test command ({100 * (killed + typed_out) / max(checked, 1):.1f} %): "
          f"mypy rejects {typed_out}, the tests kill {killed} of the {checked - typed_out} that type-check "
          f"({100 * killed / max(checked - typed_out, 1):.1f} %); of {total} in all; {len(survivors)} listed in {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
