"""The lifecycle's table: its drawing in docs/ is current, and its edges say what the rules say."""

from __future__ import annotations

from dispatcher.lifecycle.diagram import BEGIN, END, render
from dispatcher.lifecycle.states import AttemptState, NotificationState, advance, rank
from dispatcher.lifecycle.table import MOVES, NEW
from tests.conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "lifecycle.md"


def test_the_drawing_in_docs_is_generated_from_the_table() -> None:
    text = DOC.read_text()
    generated = text[text.index(BEGIN): text.index(END) + len(END)]
    assert generated == render(), "run: python -m dispatcher.lifecycle.diagram, and paste its output into docs/lifecycle.md"


def test_every_state_named_by_a_move_is_a_state() -> None:
    attempt, notification = {s.value for s in AttemptState}, {s.value for s in NotificationState}
    for move in MOVES.values():
        for side, known in ((move.attempt, attempt), (move.notification, notification)):
            for start, end in side.edges if side else ():
                assert start in known | {NEW} and end in known, (move.name, start, end)


def test_delivery_reports_only_move_forward_in_the_table_as_in_the_rule() -> None:
    side = MOVES["record_outcome"].attempt
    assert side is not None
    for start, end in side.edges:
        assert advance(AttemptState(start), AttemptState(end)) == end, (start, end)
        assert rank(AttemptState(end)) > rank(AttemptState(start))
    assert (AttemptState.DELIVERED, AttemptState.FAILED) not in side.edges  # a failure after delivery is ignored


def test_nothing_leaves_failed_or_read_but_a_hosts_retry_of_a_failed_notification() -> None:
    for move in MOVES.values():
        for side_name in ("attempt", "notification"):
            side = getattr(move, side_name)
            for start, end in side.edges if side else ():
                retried = (move.name, side_name, start, end) == ("retry_failed", "notification", "failed", "queued")
                assert start not in ("failed", "read") or start == end or retried, (move.name, start, end)
    assert MOVES["retry_failed"].attempt is not None and MOVES["retry_failed"].attempt.start == frozenset()  # a new attempt


def test_every_state_can_be_reached() -> None:
    for side_name, states in (("attempt", AttemptState), ("notification", NotificationState)):
        sides = [getattr(move, side_name) for move in MOVES.values()]
        reached = {end for side in sides if side is not None for _, end in side.edges}
        assert {state.value for state in states} <= reached, side_name
