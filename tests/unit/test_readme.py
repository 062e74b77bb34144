"""The README's promise: two set-up commands first, and CI runs exactly the test command."""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def _code_blocks(text: str) -> list[list[str]]:
    blocks = re.findall(r"```(?:sh|bash)?\n(.*?)```", text, flags=re.DOTALL)
    return [[line.split("  #")[0].strip() for line in block.splitlines() if line.strip()] for block in blocks]


def test_readme_opens_with_exactly_the_two_setup_commands() -> None:
    first_block = _code_blocks(README)[0]
    assert first_block == ["bash scripts/demo", "bash scripts/test"]
    assert README.index("```") < README.index("## "), "the two commands come before any section"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == "exec bash scripts/test"
    assert all(not line.startswith(("pytest", ".venv", "python")) for line in commands)


def test_the_scripts_the_readme_names_exist_and_are_executable() -> None:
    for script in ("scripts/demo", "scripts/test", ".ci/run"):
        path = REPO_ROOT / script
        assert path.is_file(), script
        assert path.stat().st_mode & 0o111, f"{script} is not executable"
