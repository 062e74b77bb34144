"""The folders of dispatcher/ keep their order: imports point down the flow, never back up.

intake, sending and tracking stand over the lifecycle, the store, policy and the API client; the
operator's tools stand apart. The check reads every module's imports (top level and inside
functions) and is tried against a planted import, so a reader that sees nothing cannot pass.
"""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "dispatcher"
FLOW = ("intake", "sending", "tracking")
FOUNDATIONS = ("lifecycle", "store", "policy", "api")
# folder -> folders of dispatcher/ it must never import
NEVER: dict[str, tuple[str, ...]] = {
    **{folder: ("operations",) for folder in FLOW},
    **{folder: (*FLOW, "operations") for folder in FOUNDATIONS},
    # what happened to a message is learned after it was sent: tracking asks nothing of the send path
    "tracking": ("sending", "operations"),
}


def imported_modules(source: str) -> list[str]:
    """Every module an import statement in ``source`` names (``from a import b`` gives a and a.b)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def forbidden_imports(folder: str, source: str) -> list[str]:
    banned = tuple(f"dispatcher.{other}" for other in NEVER[folder])
    return [name for name in imported_modules(source) if any(name == b or name.startswith(b + ".") for b in banned)]


def test_a_planted_import_is_seen() -> None:
    assert forbidden_imports("store", "def f():\n    from dispatcher.sending import send\n") == [
        "dispatcher.sending", "dispatcher.sending.send"]
    assert forbidden_imports("sending", "from dispatcher import operations\n") == ["dispatcher.operations"]
    assert forbidden_imports("sending", "from dispatcher.store import queries\n") == []


def test_every_folder_named_here_exists() -> None:
    assert all((PACKAGE / folder / "__init__.py").is_file() for folder in NEVER)


@pytest.mark.parametrize("folder", sorted(NEVER))
def test_imports_point_down(folder: str) -> None:
    offending = {
        str(path.relative_to(REPO_ROOT)): names
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        if (names := forbidden_imports(folder, path.read_text()))
    }
    assert offending == {}, f"{folder}/ imports what stands above it or apart: {offending}"


def test_workers_use_dispatcher_and_never_the_other_way() -> None:
    importers = [str(path.relative_to(REPO_ROOT)) for path in sorted(PACKAGE.rglob("*.py"))
                 if any(name == "workers" or name.startswith("workers.") for name in imported_modules(path.read_text()))]
    assert importers == []


def test_layout_reader_reads_real_files() -> None:
    # the send path does import the store: the reader sees real imports in real files
    send = (PACKAGE / "sending" / "send.py").read_text()
    assert any(name.startswith("dispatcher.store") for name in imported_modules(send))
