"""The folders of dispatcher/ keep their order: imports point down the flow, never back up.

Every folder (subpackage) is named here with the folders it may import: intake, sending and
tracking stand over the recipients, policy, the lifecycle, the store and the API client; the
lifecycle stands on the store, which imports no other folder (issue 46: the store knows tables and
rows, the lifecycle what a state means); the operator's tools stand apart. A new folder, or a new
import across folders, is a decision made here. The imports that are left may form no cycle, and
SQL is written in the store and the lifecycle only.
The check reads every module's imports (top level and inside functions) and is tried against a
planted import, so a reader that sees nothing cannot pass.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

import pytest

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "dispatcher"
# folder -> the folders of dispatcher/ it may import (the modules at dispatcher/'s top are not folders)
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "api": (),
    "store": (),
    # configuration stands on the store's one value type (an account, as rows are keyed), under
    # everything that reads it: the policy reads routes and windows, never the reverse (issue 46)
    "settings": ("store",),
    "lifecycle": ("store",),
    "policy": ("api", "lifecycle", "settings"),
    "recipients": ("policy", "settings", "store"),
    "callbacks": ("settings", "store"),
    "intake": ("lifecycle", "policy", "recipients", "settings", "store"),
    # what happened to a message is learned after it was sent: tracking asks nothing of the send path
    "tracking": ("api", "intake", "lifecycle", "policy", "recipients", "settings", "store"),
    "sending": ("api", "intake", "lifecycle", "policy", "recipients", "settings", "store", "tracking"),
    "operations": ("api", "callbacks", "intake", "lifecycle", "policy", "settings", "store"),
}
FOLDERS = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))


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


def folders_imported(folder: str, source: str) -> set[str]:
    """The other folders of dispatcher/ that ``source``, a module of ``folder``, imports."""
    return {name.split(".")[1] for name in imported_modules(source)
            if name.startswith("dispatcher.") and name.split(".")[1] in FOLDERS and name.split(".")[1] != folder}


def forbidden_imports(folder: str, source: str) -> list[str]:
    banned = tuple(f"dispatcher.{other}" for other in FOLDERS if other != folder and other not in MAY_IMPORT[folder])
    return [name for name in imported_modules(source) if any(name == b or name.startswith(b + ".") for b in banned)]


def import_graph() -> dict[str, set[str]]:
    """Folder -> the folders its modules import, read from the files."""
    return {folder: set().union(*(folders_imported(folder, path.read_text()) for path in (PACKAGE / folder).rglob("*.py")))
            for folder in FOLDERS}


def a_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as the folders along it (the first repeated at the end), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for other in sorted(graph.get(node, ())):
            if state.get(other) == "open":
                return path[path.index(other):] + [other]
            if other not in state and (found := visit(other)) is not None:
                return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_a_planted_import_is_seen() -> None:
    assert forbidden_imports("store", "def f():\n    from dispatcher.sending import send\n") == [
        "dispatcher.sending", "dispatcher.sending.send"]
    assert forbidden_imports("store", "from dispatcher.lifecycle.states import AttemptState\n") == [
        "dispatcher.lifecycle.states", "dispatcher.lifecycle.states.AttemptState"]
    assert forbidden_imports("sending", "from dispatcher import operations\n") == ["dispatcher.operations"]
    assert forbidden_imports("sending", "from dispatcher.store import queries\n") == []


def test_a_planted_cycle_is_seen() -> None:
    assert a_cycle({"store": {"lifecycle"}, "lifecycle": {"store"}}) == ["lifecycle", "store", "lifecycle"]
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert a_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_every_folder_is_named_here() -> None:
    """A new folder says what it may import; a folder named here exists."""
    assert sorted(MAY_IMPORT) == FOLDERS
    assert all(other in FOLDERS for allowed in MAY_IMPORT.values() for other in allowed)


def test_the_allowed_imports_form_no_cycle() -> None:
    assert a_cycle({folder: set(allowed) for folder, allowed in MAY_IMPORT.items()}) is None


def test_the_imports_form_no_cycle() -> None:
    assert a_cycle(import_graph()) is None


@pytest.mark.parametrize("folder", FOLDERS)
def test_imports_point_down(folder: str) -> None:
    offending = {
        str(path.relative_to(REPO_ROOT)): names
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        if (names := forbidden_imports(folder, path.read_text()))
    }
    assert offending == {}, f"{folder}/ imports what stands above it or apart: {offending}"


# SQL is written in the store and the lifecycle only (issue 46): elsewhere a module may name a
# session's type and catch the store's errors, and read a row by its key (``session.get``), but
# builds and runs no statement
SQL_FOLDERS = ("store", "lifecycle")
ALLOWED_SQLALCHEMY = ("sqlalchemy.orm", "sqlalchemy.exc")
STATEMENT_CALLS = frozenset({"execute", "scalar", "scalars", "query", "add", "add_all", "delete", "merge"})


def sql_written(source: str) -> list[str]:
    """What in ``source`` builds or runs a statement: sqlalchemy imports beyond the session's
    types and errors, and statement calls on a session or connection."""
    found = [name for name in imported_modules(source)
             if (name == "sqlalchemy" or name.startswith("sqlalchemy."))
             and not any(name == allowed or name.startswith(allowed + ".") for allowed in ALLOWED_SQLALCHEMY)]
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STATEMENT_CALLS
                and isinstance(node.func.value, ast.Name)
                and ("session" in node.func.value.id or "connection" in node.func.value.id)):
            found.append(f"{node.func.value.id}.{node.func.attr}()")
    return found


def test_planted_sql_is_seen() -> None:
    assert sql_written("from sqlalchemy import select\n") == ["sqlalchemy", "sqlalchemy.select"]
    assert sql_written("def f(session):\n    return session.execute(stmt)\n") == ["session.execute()"]
    assert sql_written("from sqlalchemy.orm import Session\ndef f(session):\n    return session.get(A, 1)\n") == []


def test_sql_lives_in_the_store_and_the_lifecycle() -> None:
    offending = {
        str(path.relative_to(REPO_ROOT)): names
        for path in sorted([*PACKAGE.rglob("*.py"), *(REPO_ROOT / "workers").rglob("*.py")])
        if path.relative_to(REPO_ROOT).parts[1] not in SQL_FOLDERS and (names := sql_written(path.read_text()))
    }
    assert offending == {}, f"SQL outside {', '.join(SQL_FOLDERS)}/: {offending}"


def test_workers_use_dispatcher_and_never_the_other_way() -> None:
    importers = [str(path.relative_to(REPO_ROOT)) for path in sorted(PACKAGE.rglob("*.py"))
                 if any(name == "workers" or name.startswith("workers.") for name in imported_modules(path.read_text()))]
    assert importers == []


def test_layout_reader_reads_real_files() -> None:
    # the send path does import the store: the reader sees real imports in real files
    send = (PACKAGE / "sending" / "send.py").read_text()
    assert any(name.startswith("dispatcher.store") for name in imported_modules(send))
    assert "store" in import_graph()["lifecycle"]
