"""What a PromQL expression names: its metrics, the labels it matches on each, the labels it
groups or joins by. Enough of PromQL for the expressions of deploy/ (a test checks each against
what the code exports); not a full parser, but strict where it matters: an identifier that is not
a known function, aggregation or keyword is taken for a metric, so a misspelt function is not
quietly skipped, and an expression it cannot read is refused.

Read in this order, each step removing what it read: string literals (inside label matchers),
Grafana's variables (``$__rate_interval``, ``${datasource}``), range and subquery brackets
(``[5m]``, ``[10m:30s]``), grouping clauses (``by (...)``, ``without``, ``on``, ``ignoring``,
``group_left``/``group_right``), label matchers (``{...}``, bound to the metric name before them),
then identifiers: followed by ``(`` a function or aggregation, else a keyword, else a metric.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FUNCTIONS = frozenset({
    # aggregations
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
    # functions (Prometheus 2.42)
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "day_of_month",
    "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor", "histogram_count",
    "histogram_fraction", "histogram_quantile", "histogram_sum", "holt_winters", "hour", "idelta", "increase",
    "irate", "label_join", "label_replace", "ln", "log2", "log10", "minute", "month", "predict_linear", "rate",
    "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "time", "timestamp", "vector", "year",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time",
    "stddev_over_time", "stdvar_over_time", "last_over_time", "present_over_time",
})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"})
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
MATCHERS = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^{}]*)\}")
MATCHER = re.compile(r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*\"\"\s*$")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
DURATION = re.compile(r"(?<![a-zA-Z0-9_:.])(?:\d+(?:ms|s|m|h|d|w|y))+(?![a-zA-Z0-9_:])")
NUMBER = re.compile(r"(?<![a-zA-Z0-9_:.])\d+(?:\.\d+)?(?:e[+-]?\d+)?")


class Unreadable(ValueError):
    """The expression holds something this reader does not know: fix the reader or the expression."""


@dataclass
class Names:
    """What one expression names."""

    metrics: set[str] = field(default_factory=set)
    matched: dict[str, set[str]] = field(default_factory=dict)  # metric -> the labels its matchers name
    grouped: set[str] = field(default_factory=set)  # labels named by by/without/on/ignoring/group_*


def names_in(expression: str) -> Names:
    names = Names()
    text = STRING.sub('""', expression)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "1m", text)  # Grafana's variables stand for durations here
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    for _, labels in GROUPING.findall(text):
        names.grouped |= {label.strip() for label in labels.split(",") if label.strip()}
    text = GROUPING.sub(" ", text)

    def matchers(found: re.Match[str]) -> str:
        metric, body = found.group(1), found.group(2)
        if not metric:
            raise Unreadable(f"a selector without a metric name: {{{body}}}")
        labels = set()
        for part in (part for part in body.split(",") if part.strip()):
            matcher = MATCHER.match(part)
            if matcher is None:
                raise Unreadable(f"a label matcher it cannot read: {part!r}")
            labels.add(matcher.group(1))
        names.matched.setdefault(metric, set()).update(labels)
        return f" {metric} "

    text = MATCHERS.sub(matchers, text)
    if "{" in text or "}" in text or "[" in text or "]" in text:
        raise Unreadable(f"brackets left over in {expression!r}")
    text = NUMBER.sub(" ", DURATION.sub(" ", text))
    for found in IDENTIFIER.finditer(text):
        word = found.group(0)
        followed_by_call = text[found.end():].lstrip().startswith("(")
        if followed_by_call:
            if word not in FUNCTIONS:
                raise Unreadable(f"{word}( is not a PromQL function or aggregation")
        elif word not in KEYWORDS:
            names.metrics.add(word)
    names.metrics |= set(names.matched)
    return names
