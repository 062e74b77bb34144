"""Nothing outside dispatcher/lifecycle/ writes a state column: the lifecycle has one home.

The check reads the source (every module of dispatcher/ and workers/, none excepted but the
lifecycle package) and looks for each way SQLAlchemy code can write a column: a keyword or a dict
key named like a state column in ``.values(...)``, ``insert``/``update``, or the ``Notification`` /
``Attempt`` constructors; an assignment to such an attribute; raw SQL that sets one. It is checked
against planted writes, so a scanner that sees nothing cannot pass.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

STATE_COLUMNS = frozenset({"state", "delivery_state", "fallback_decision"})
WRITERS = frozenset({"values", "Notification", "Attempt", "insert", "update"})
# SET ... state = ..., before any WHERE (a condition on a state column is a read)
RAW_SET = re.compile(r"\bset\b(?:(?!\bwhere\b)[^;])*\b(state|delivery_state|fallback_decision)\s*=", re.IGNORECASE)
HOME = REPO_ROOT / "dispatcher" / "lifecycle"


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def state_writes(source: str) -> list[int]:
    """Line numbers of the writes of a state column in ``source``."""
    tree = ast.parse(source)
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):  # any helper that takes the columns to write as values=
            lines += [node.lineno for keyword in node.keywords
                      if keyword.arg == "values" and isinstance(keyword.value, ast.Dict)
                      for key in keyword.value.keys if isinstance(key, ast.Constant) and key.value in STATE_COLUMNS]
        if isinstance(node, ast.Call) and _name(node.func) in WRITERS:
            for keyword in node.keywords:
                if keyword.arg in STATE_COLUMNS:
                    lines.append(node.lineno)
                elif keyword.arg is None and isinstance(keyword.value, ast.Dict):
                    lines += [node.lineno for key in keyword.value.keys
                              if isinstance(key, ast.Constant) and key.value in STATE_COLUMNS]
            lines += [node.lineno for arg in node.args if isinstance(arg, ast.Dict)
                      for key in arg.keys if isinstance(key, ast.Constant) and key.value in STATE_COLUMNS]
        elif isinstance(node, ast.Dict) and any(
            isinstance(key, ast.Constant) and key.value in STATE_COLUMNS for key in node.keys
        ) and _feeds_a_write(tree, node):
            lines.append(node.lineno)
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            lines += [node.lineno for target in targets
                      if isinstance(target, ast.Attribute) and target.attr in STATE_COLUMNS]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and RAW_SET.search(node.value):
            lines.append(node.lineno)
    return sorted(set(lines))


def _feeds_a_write(tree: ast.AST, dictionary: ast.Dict) -> bool:
    """A dict of values assigned to a name that a writer then expands (``.values(**values)``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is dictionary:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {target.id for target in targets if isinstance(target, ast.Name)}
            return any(
                isinstance(call, ast.Call)
                and any(isinstance(keyword.value, ast.Name) and keyword.value.id in names
                        and (keyword.arg == "values" or (keyword.arg is None and _name(call.func) in WRITERS))
                        for keyword in call.keywords)
                for call in ast.walk(tree)
            )
    return False


def modules_outside_the_home() -> list[Path]:
    found = [path for folder in ("dispatcher", "workers") for path in (REPO_ROOT / folder).rglob("*.py")
             if HOME not in path.parents]
    assert len(found) > 40  # the walk really saw the code
    return sorted(found)


def test_no_module_outside_the_lifecycle_writes_a_state_column() -> None:
    offenders = {str(path.relative_to(REPO_ROOT)): lines for path in modules_outside_the_home()
                 if (lines := state_writes(path.read_text()))}
    assert offenders == {}


def test_the_lifecycle_itself_is_where_the_writes_are() -> None:
    moves = (HOME / "moves.py").read_text()
    assert len(state_writes(moves)) >= 8  # the scanner finds the moves' own writes


@pytest.mark.parametrize("planted", [
    "session.execute(update(NOTIFICATIONS).values(state='failed'))",
    "session.execute(update(ATTEMPTS).values(**{'state': 'queued'}))",
    "values = {'delivery_state': 'read'}\nsession.execute(update(T).values(**values))",
    "Notification(event_id='e', state='queued')",
    "notification.fallback_decision = 'none'",
    "session.execute(text('UPDATE notifications SET state = :s WHERE id = :i'))",
    "op.execute(\"UPDATE attempts SET tries = 0, state = 'queued' WHERE id = 1\")",
    "session.execute(insert(ATTEMPTS).values(state='queued'))",
    "store.set_notification_state(session, 1, expected=(), values={'state': 'read'})",
    "values = {'fallback_decision': 'none'}\nstore.decide_once(session, 1, values=values)",
])
def test_the_check_sees_every_kind_of_write(planted: str) -> None:
    assert state_writes(planted) != []


@pytest.mark.parametrize("innocent", [
    "JSONResponse({'event_id': e, 'state': record.state})",
    "NotificationRecord(state=notification.state)",
    "select(Notification).where(Notification.state == 'queued')",
    "counts[state] = 1",
    "op.execute(\"UPDATE notifications SET current_attempt = 2 WHERE fallback_decision = 'fallback'\")",
])
def test_reads_and_answers_are_not_writes(innocent: str) -> None:
    assert state_writes(innocent) == []
