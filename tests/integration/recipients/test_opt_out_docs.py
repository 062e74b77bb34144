"""docs/opt-outs.md's examples work as written: its Python block and its shell block run in a
scratch folder (config/, docs/ and .venv linked, ./var/ fresh) on the embedded defaults."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DOC = (REPO_ROOT / "docs" / "opt-outs.md").read_text()


def _blocks(language: str) -> list[str]:
    return [block.strip() for block in re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.DOTALL)]


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    for name in ("config", "docs", ".venv"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    return tmp_path


def _environment() -> dict[str, str]:
    keep = {key: value for key, value in os.environ.items() if not key.startswith("DISPATCHER_")}
    return {**keep, "DISPATCHER_CONFIG": "config/dispatcher.example.toml"}


def test_the_python_and_shell_examples_run_as_written(workdir: Path) -> None:
    (python_block,) = _blocks("python")
    ran = subprocess.run([sys.executable, "-c", python_block], cwd=workdir, env=_environment(),
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "True"

    (shell_block,) = _blocks("sh")
    outputs = []
    for line in shell_block.splitlines():
        ran = subprocess.run(["bash", "-c", shell_block.split("\n")[0] + "\n" + line], cwd=workdir,
                             env=_environment(), capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, (line, ran.stderr)
        outputs.append(ran.stdout)
    added, listed, imported, removed = outputs[1:]
    assert json.loads(added) == {"added": 1}
    assert "sms" in listed and "+1555" not in listed and "identifier" not in listed
    report = json.loads(imported)
    assert (report["rows"], report["added"]) == (3, 3)
    assert json.loads(removed) == {"lifted": 1}
