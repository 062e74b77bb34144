"""Statements built and compiled once per process, and a count of the compilations that happen anyway.

SQLAlchemy 2.0 caches a Core statement's compiled form by its cache key, but some statements have
none: every dialect's ``INSERT ... ON CONFLICT`` (``inherit_cache = False`` in both dialects'
``dml.py``), so each execution compiles it anew. A statement that the hot paths run for every send,
delivery or outcome is therefore written once as Core, with :func:`sqlalchemy.bindparam` for
everything that varies, and :func:`built_once` turns it into a ``text()`` per dialect the first
time it runs: plain SQL with the same typed parameters and typed ``RETURNING`` columns, which
SQLAlchemy caches by its text. The Core form stays the one place the statement is written.

:func:`count_compilations` counts what still compiles (a cache miss, or a statement without a cache
key): the benchmarks report it per send and per outcome, and a test holds the hot paths to none
after warm-up.
"""

from __future__ import annotations

import copy
import functools
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, bindparam, column, event, text
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.engine.interfaces import BindTyping, CacheStats
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import TextClause

_EVERY: list[BuiltOnce] = []  # each statement built once, for forget_built_statements

_EXPANDING = re.compile(r"\(__\[POSTCOMPILE_(\w+)\]\)")  # how an expanding parameter (IN) is left in the SQL


class BuiltOnce:
    """A statement written once as Core, run as a ``text()`` compiled once per dialect."""

    def __init__(self, build: Callable[[str], Any]) -> None:
        self._build = build  # the dialect's name ("sqlite", "postgresql") -> the Core statement
        self._texts: dict[str, TextClause] = {}
        self._lock = threading.Lock()
        _EVERY.append(self)

    def forget(self) -> None:
        with self._lock:
            self._texts.clear()

    def __call__(self, session: Session | Connection) -> TextClause:
        dialect = session.get_bind().dialect if isinstance(session, Session) else session.dialect
        found = self._texts.get(dialect.name)
        if found is None:
            with self._lock:
                found = self._texts.get(dialect.name)
                if found is None:
                    found = self._texts[dialect.name] = as_text(self._build(dialect.name), dialect)
        return found


def built_once(build: Callable[[str], Any]) -> BuiltOnce:
    """Decorate a function of the dialect's name that builds the statement (see the module's doc)."""
    return BuiltOnce(build)


def forget_built_statements() -> None:
    """Build every statement anew at its next run. For the mutation run (docs/simulation.md), whose
    mutants live in the builders: a statement built by an earlier test would hide a mutant from the
    next, and mutmut would map a builder only to the first test that ran it."""
    for statement in _EVERY:
        statement.forget()


def as_text(statement: Any, dialect: Dialect) -> TextClause:
    """``statement`` compiled for ``dialect`` as SQL with ``:name`` parameters, typed as the Core
    statement typed them (a value bound at build time is kept as the parameter's default), with the
    statement's ``RETURNING`` (or selected) columns typing its rows."""
    named = copy.copy(dialect)  # the same dialect, asked for named parameters and no rendered casts
    named.paramstyle, named.positional = "named", False
    named.bind_typing = BindTyping.NONE  # the text is compiled again by the real dialect, which adds them
    named._bind_typing_render_casts = False  # what the compiler reads (set from bind_typing at the dialect's start)
    compiled = statement.compile(dialect=named)
    sql = _EXPANDING.sub(r":\1", compiled.string)  # text() renders an expanding parameter's parentheses itself
    # A column default computed in Python (``default=utcnow``) is filled in by Core's execution, not
    # by the text's: the text's parameter calls it instead.
    computed = {column.key: column.default for column in getattr(compiled, "insert_prefetch", ())}
    computed.update({column.key: column.onupdate for column in getattr(compiled, "update_prefetch", ())})
    parameters = []
    for parameter, name in compiled.bind_names.items():
        default = computed.get(name)
        if default is not None and default.is_callable:
            parameters.append(bindparam(name, callable_=functools.partial(default.arg, None), type_=parameter.type))
        elif default is not None and default.is_scalar:
            parameters.append(bindparam(name, value=default.arg, type_=parameter.type))
        elif parameter.callable is not None:
            parameters.append(bindparam(name, callable_=parameter.callable, type_=parameter.type))
        elif parameter.value is None and parameter.required:
            parameters.append(bindparam(name, type_=parameter.type, expanding=parameter.expanding))
        else:
            parameters.append(bindparam(name, value=parameter.value, type_=parameter.type, expanding=parameter.expanding))
    built = text(sql).bindparams(*parameters)
    returned = list(getattr(statement, "_returning", ()) or ())
    if not returned and getattr(statement, "is_select", False):
        returned = list(statement.selected_columns)
    # Typed by name, not by the statement's own columns: a column of a CTE that has no cache key
    # (an INSERT ... ON CONFLICT) has none either, and would leave the text uncached as well.
    typed = [column(element.name, element.type) for element in returned]
    return built.columns(*typed) if typed else built  # type: ignore[return-value]


@contextmanager
def count_compilations(engine: Engine) -> Iterator[Counter[str]]:
    """Count the statements ``engine`` compiles while the block runs, by their first 60 characters:
    a compiled-cache miss, or a statement that has no cache key (compiled on every execution).
    Statements the driver is handed as they are (``BEGIN IMMEDIATE``) compile nothing and are not
    counted."""
    compiled: Counter[str] = Counter()

    def seen(_conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool) -> None:
        if isinstance(context, DefaultExecutionContext) and context.compiled is not None \
                and context.cache_hit is not CacheStats.CACHE_HIT:
            compiled[" ".join(statement.split())[:60]] += 1

    event.listen(engine, "after_cursor_execute", seen)
    try:
        yield compiled
    finally:
        event.remove(engine, "after_cursor_execute", seen)
