"""Every ``error_kind`` the code can write is in docs/notifications.md's "Error kinds" table, and the
table lists none the code cannot write.

The kinds are found by reading the source of every module under dispatcher/ (an AST scan), not by
a list kept here: a kind added to the code without a row fails this test, naming it. The scan
follows a value to where it is written as an error kind:

* the value of an ``error_kind=`` keyword, of an ``"error_kind"`` dict entry or subscript, and the
  default of a parameter named ``error_kind``;
* the positional argument that lands on an ``error_kind`` parameter (``_fail(job, ctx, "kind",
  detail)``) or dataclass field (``Decision``);
* through a module constant (``CRASH_LOOP = "crash_loop"``, also as ``moves.CRASH_LOOP``), a local
  variable assigned in the same function, ``a or b``, ``a if c else b`` and SQL ``coalesce(...)``;

and adds the kinds the code keeps in tables: the retry policy's ``_KINDS``, the waiting and
set-aside kinds of the lifecycle's moves, the send failures without a fallback, and the recipient
refusals (``Blocked``, written as ``blocked.value``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dispatcher.lifecycle.moves import SET_ASIDE_KINDS, WAITING_KINDS
from dispatcher.policy.fallback import _SEND_FAILURES_WITHOUT_FALLBACK
from dispatcher.policy.retry import _KINDS
from dispatcher.store.suppressions import Blocked
from tests.conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "notifications.md"
PACKAGE = REPO_ROOT / "dispatcher"
HEADING = "## Error kinds"
COLUMNS = ["error_kind", "Where", "What happened", "Falls back", "What to do"]
PARAMETER = "error_kind"
CONSTANT_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
ROW = re.compile(r"^\|\s*`([a-z][a-z0-9_]*)`\s*\|")

# Kinds the code keeps in tables rather than writing them where they are named.
TABLED_KINDS: frozenset[str] = frozenset(
    {kind for _, kind in _KINDS} | WAITING_KINDS | SET_ASIDE_KINDS | _SEND_FAILURES_WITHOUT_FALLBACK
    | {blocked.value for blocked in Blocked}
)


# --- the documented table ------------------------------------------------------------------------


def _section(text: str) -> list[str]:
    """The lines of the "Error kinds" section, up to the next heading of its level or above."""
    lines = text.splitlines()
    assert lines.count(HEADING) == 1, f"docs/notifications.md needs exactly one {HEADING!r} heading"
    start = lines.index(HEADING) + 1
    end = next((i for i in range(start, len(lines)) if re.match(r"^#{1,2} ", lines[i])), len(lines))
    return lines[start:end]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def documented_rows() -> list[list[str]]:
    """The table's rows whose first cell is a backticked kind, as lists of cells."""
    return [_cells(line) for line in _section(DOC.read_text()) if ROW.match(line)]


def documented_kinds() -> list[str]:
    return [row[0].strip("`") for row in documented_rows()]


# --- the scan of the code --------------------------------------------------------------------------


@dataclass
class _Scan:
    """What the whole package says: its string constants, and where error kinds are written."""

    constants: dict[str, set[str]] = field(default_factory=dict)  # NAME -> its values, over every module
    positions: dict[str, set[int]] = field(default_factory=dict)  # callable name -> index of its error_kind argument
    written: list[tuple[ast.expr, ast.AST | None, Path]] = field(default_factory=list)  # (value, its function, file)


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _functions(tree: ast.AST) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
    """Every function, and whether it is a method (its first parameter is the instance or class)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield item, True
        elif isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield item, False


def _collect_definitions(scan: _Scan, tree: ast.Module) -> None:
    """Module constants; the positional index of every ``error_kind`` parameter and dataclass field."""
    for statement in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign):
            targets, value = [statement.target], statement.value
        for target in targets:
            if (isinstance(target, ast.Name) and CONSTANT_NAME.match(target.id)
                    and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                scan.constants.setdefault(target.id, set()).add(value.value)
    for function, is_method in _functions(tree):
        positional = [arg.arg for arg in function.args.posonlyargs + function.args.args]
        if is_method and positional and positional[0] in ("self", "cls"):
            positional = positional[1:]
        if PARAMETER in positional:
            scan.positions.setdefault(function.name, set()).add(positional.index(PARAMETER))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(_is_dataclass(decorator) for decorator in node.decorator_list):
            fields = [item.target.id for item in node.body
                      if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)]
            if PARAMETER in fields:
                scan.positions.setdefault(node.name, set()).add(fields.index(PARAMETER))


def _is_dataclass(decorator: ast.expr) -> bool:
    """``@dataclass``, ``@dataclass(...)``, ``@dataclasses.dataclass``: a class built from its fields, in order."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Name) and target.id == "dataclass") or \
        (isinstance(target, ast.Attribute) and target.attr == "dataclass")


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _is_error_kind_key(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == PARAMETER


def _collect_writes(scan: _Scan, tree: ast.Module, path: Path) -> None:
    """Every expression written as an error kind, with the function it is in (for its locals)."""
    def visit(node: ast.AST, function: ast.AST | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node
            arguments = node.args
            positional = arguments.posonlyargs + arguments.args
            pairs = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults, strict=True))
            pairs += [(arg, default) for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
                      if default is not None]
            scan.written.extend((default, function, path) for arg, default in pairs if arg.arg == PARAMETER)
        elif isinstance(node, ast.Call):
            scan.written.extend((keyword.value, function, path) for keyword in node.keywords if keyword.arg == PARAMETER)
            name = _called_name(node)
            for index in scan.positions.get(name or "", set()):
                if index < len(node.args) and not any(isinstance(arg, ast.Starred) for arg in node.args[:index + 1]):
                    scan.written.append((node.args[index], function, path))
        elif isinstance(node, ast.Dict):
            scan.written.extend((value, function, path) for key, value in zip(node.keys, node.values, strict=True)
                                if _is_error_kind_key(key))
        elif isinstance(node, ast.Assign):
            scan.written.extend((node.value, function, path) for target in node.targets
                                if isinstance(target, ast.Subscript) and _is_error_kind_key(target.slice))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)


def _local_values(function: ast.AST | None, name: str) -> list[ast.expr]:
    """What a function assigns to the local ``name`` (``name = x``, or ``name, other = x, y``)."""
    if function is None:
        return []
    found: list[ast.expr] = []
    for node in ast.walk(function):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id == name:
                found.append(node.value)
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                found.extend(value for element, value in zip(target.elts, node.value.elts, strict=False)
                             if isinstance(element, ast.Name) and element.id == name)
    return found


def _kinds_of(scan: _Scan, expression: ast.expr, function: ast.AST | None, seen: frozenset[str] = frozenset()) -> set[str]:
    """The string values ``expression`` can take, as far as the source says."""
    if isinstance(expression, ast.Constant):
        return {expression.value} if isinstance(expression.value, str) else set()
    if isinstance(expression, ast.BoolOp):
        return set().union(*(_kinds_of(scan, value, function, seen) for value in expression.values))
    if isinstance(expression, ast.IfExp):
        return _kinds_of(scan, expression.body, function, seen) | _kinds_of(scan, expression.orelse, function, seen)
    if isinstance(expression, ast.Call) and _called_name(expression) == "coalesce":  # SQL: one of its arguments
        return set().union(*(_kinds_of(scan, arg, function, seen) for arg in expression.args))
    if isinstance(expression, ast.Attribute) and CONSTANT_NAME.match(expression.attr):  # moves.CRASH_LOOP
        return set(scan.constants.get(expression.attr, set()))
    if isinstance(expression, ast.Name) and expression.id not in seen:
        if CONSTANT_NAME.match(expression.id):
            return set(scan.constants.get(expression.id, set()))
        kinds: set[str] = set()
        for value in _local_values(function, expression.id):
            kinds |= _kinds_of(scan, value, function, seen | {expression.id})
        return kinds
    return set()


def scanned_kinds() -> dict[str, set[str]]:
    """Every error kind the scan finds, with the files that write it (``<tables>`` for the tabled ones)."""
    scan = _Scan()
    modules = list(_modules())
    for _, tree in modules:
        _collect_definitions(scan, tree)
    for path, tree in modules:
        _collect_writes(scan, tree, path)
    kinds: dict[str, set[str]] = {}
    for expression, function, path in scan.written:
        for kind in _kinds_of(scan, expression, function):
            kinds.setdefault(kind, set()).add(str(path.relative_to(REPO_ROOT)))
    for kind in TABLED_KINDS:
        kinds.setdefault(kind, set()).add("<tables>")
    return kinds


def _quoted_in_package(kind: str) -> bool:
    quoted = (f'"{kind}"', f"'{kind}'")
    return any(any(literal in path.read_text() for literal in quoted) for path in PACKAGE.rglob("*.py"))


# --- the tests -----------------------------------------------------------------------------------------


def test_the_table_has_its_columns_one_row_per_kind_in_order() -> None:
    section = _section(DOC.read_text())
    header = next(line for line in section if line.startswith("|"))
    assert _cells(header) == COLUMNS
    rows = documented_rows()
    assert rows, "the Error kinds table has no row"
    assert all(len(row) == len(COLUMNS) for row in rows), [row[0] for row in rows if len(row) != len(COLUMNS)]
    kinds = documented_kinds()
    assert len(kinds) == len(set(kinds)), sorted({kind for kind in kinds if kinds.count(kind) > 1})
    assert kinds == sorted(kinds), "the rows are not in alphabetical order"


def test_the_scan_finds_what_the_survey_found() -> None:
    """The scan itself works: kinds written only through a constant, a local variable, a positional
    argument, a dict entry, a parameter's default or coalesce's default are found."""
    found = scanned_kinds()
    for kind, written_in in {
        "crash_loop": "dispatcher/lifecycle/moves.py",  # set_aside's default, a constant
        "cancelled": "dispatcher/lifecycle/moves.py",  # a dict entry, a constant
        "failed": "dispatcher/lifecycle/moves.py",  # coalesce(..., decision.error_kind or "failed")
        "outcome_unknown": "dispatcher/sending/record.py",  # a local variable, an imported constant
        "workspace_unconfigured": "dispatcher/sending/claim.py",  # moves.WORKSPACE_UNCONFIGURED
        "not_contactable": "dispatcher/sending/send.py",  # record.fail's third argument
        "internal": "dispatcher/tracking/outcomes.py",  # a positional argument, error_kind or "internal"
        "external_error": "dispatcher/tracking/outcomes.py",
    }.items():
        assert written_in in found.get(kind, set()), f"{kind} not found written in {written_in}"


def test_every_kind_the_code_writes_is_documented() -> None:
    found = scanned_kinds()
    missing = sorted(set(found) - set(documented_kinds()))
    assert not missing, "error kinds written by dispatcher/ but missing from docs/notifications.md's Error kinds table: " + \
        ", ".join(f"{kind} ({', '.join(sorted(found[kind]))})" for kind in missing)


def test_every_documented_kind_is_in_the_code() -> None:
    found = scanned_kinds()
    extra = sorted(kind for kind in documented_kinds() if kind not in found and not _quoted_in_package(kind))
    assert not extra, f"docs/notifications.md documents error kinds that dispatcher/ never names: {', '.join(extra)}"
