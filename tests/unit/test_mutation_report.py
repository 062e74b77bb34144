"""scripts/mutation_report.py reads each survivor's change from mutmut's copy and sorts it by kind."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("mutation_report", REPO_ROOT / "scripts" / "mutation_report.py")
assert spec is not None and spec.loader is not None
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

MUTATED = '''
def x_wait__mutmut_orig(job, ctx):
    log.info("waiting %s", job)
    return Result("retry", "the limiter says not now", delay_s=backoff(job.tries))

def x_wait__mutmut_1(job, ctx):
    log.info(None, job)
    return Result("retry", "the limiter says not now", delay_s=backoff(job.tries))

def x_wait__mutmut_2(job, ctx):
    log.info("waiting %s", job)
    return Result("retry", "XXthe limiter says not nowXX", delay_s=backoff(job.tries))

def x_wait__mutmut_3(job, ctx):
    log.info("waiting %s", job)
    return Result("retry", "the limiter says not now", delay_s=backoff(None))

def x_wait__mutmut_4(job, ctx):
    log.info("waiting %s", job)
    return Result("skipped", "the limiter says not now", delay_s=backoff(job.tries))
'''


def test_each_survivor_gets_its_changed_lines_and_a_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mutants" / "dispatcher").mkdir(parents=True)
    (tmp_path / "mutants" / "dispatcher" / "sending.py").write_text(MUTATED)
    monkeypatch.chdir(tmp_path)
    modules: dict = {}
    kinds = {}
    for number in (1, 2, 3, 4):
        removed, added = report.change(f"dispatcher.sending.x_wait__mutmut_{number}", modules)
        assert len(removed) == len(added) == 1 and removed != added
        kinds[number] = report.kind_of("survived", removed, added)
    assert kinds == {1: "log", 2: "text", 3: "timing", 4: "behaviour"}
    assert report.kind_of("no tests", [], []) == "unreached"


def test_a_mutant_mypy_rejects_fails_the_test_command_and_is_not_listed_as_a_survivor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mutants" / "dispatcher").mkdir(parents=True)
    (tmp_path / "mutants" / "dispatcher" / "sending.py").write_text(MUTATED)
    (tmp_path / "docs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(report, "results", lambda: {
        "dispatcher.sending.x_wait__mutmut_1": "killed",
        "dispatcher.sending.x_wait__mutmut_2": "caught by type check",
        "dispatcher.sending.x_wait__mutmut_3": "survived",
        "dispatcher.sending.x_wait__mutmut_4": "not checked",
    })
    assert report.main([]) == 0
    page = (tmp_path / "docs" / "mutation-survivors.md").read_text()
    assert "**2 of 3 mutants checked fail the test command (66.7 %)**" in page
    assert "mypy --strict rejects 1, the tests kill 1 of the 2 that type-check (50.0 %)" in page
    assert "`dispatcher.sending.wait` | 1 |" in page  # the survivor, and only it
    assert "XXthe limiter" not in page and "backoff(None)" in page
    assert "2 of 3 checked fail the test command" in capsys.readouterr().out
