"""The alert rules and the example configuration in deploy/prometheus, checked by Prometheus's own
promtool: the rules parse, the configuration loads them, and the unit tests of alerts_test.yml
(each rule fires on what it is about, and stays quiet beside it) pass. promtool comes with
Debian's ``prometheus`` package, which ``scripts/test`` installs when it is missing: without it
these tests fail, they are never skipped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration

RULES = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO_ROOT / "deploy" / "prometheus" / "alerts_test.yml"
CONFIG = REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml"


def promtool(*arguments: str) -> subprocess.CompletedProcess[str]:
    program = shutil.which("promtool")
    assert program is not None, "promtool is missing: install Debian's prometheus package (scripts/test does)"
    return subprocess.run([program, *arguments], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_the_rules_parse() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout


def test_the_example_configuration_loads_the_rules() -> None:
    checked = promtool("check", "config", str(CONFIG))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_rules_unit_tests_pass() -> None:
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_a_broken_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests expecting the breaker alert to carry another reason."""
    broken = RULE_TESTS.read_text().replace("              reason: auth\n", "              reason: unreachable\n")
    assert broken != RULE_TESTS.read_text()
    copy = tmp_path / "alerts_test.yml"
    copy.write_text(broken.replace("  - alerts.yml", f"  - {RULES}"))
    tested = promtool("test", "rules", str(copy))
    assert tested.returncode != 0 and "DispatcherWorkspacePaused" in tested.stdout + tested.stderr
