"""The overview's trends drawn on the server as inline SVG: pure functions, records in, markup out.

No script and no external asset (the pages' content security policy allows neither). Every chart
is an image with a title and a description a screen reader reads (``role="img"``,
``aria-labelledby``), labelled axes with their units, a legend with each series' total (lines
differ by dash as well as colour), and a ``<title>`` on each point with a count, which a browser
shows on hover. Every text is escaped: route names come from the configuration, not from us.
Counts, routes and times only: nothing here is given content or contact data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

from markupsafe import Markup

from dispatcher.lifecycle.trends import RouteLatency, Trends

WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 44, 44  # room for the y ticks, the title and legend above, the x ticks and label below
TITLE_Y, LEGEND_Y = 16, 34
NOTHING = "Nothing in the last hour."
INK, GRID, MUTED = "#1d2329", "#e3e6ea", "#6b7280"


@dataclass(frozen=True)
class Line:
    """One series of a per-minute chart: a value per minute, drawn in ``colour`` with ``dash``
    (an SVG stroke-dasharray, "" for solid) so it is told apart without colour too."""

    label: str
    values: tuple[int, ...]
    colour: str
    dash: str = ""


@dataclass(frozen=True)
class TrendCharts:
    per_minute: Markup
    backlog: Markup
    latency: Markup


def draw_trends(trends: Trends) -> TrendCharts:
    """The overview's three charts of ``trends``."""
    starts = [minute.start for minute in trends.minutes]
    return TrendCharts(
        per_minute=per_minute_chart(
            "trend-rates", "Handed over, sent and settled per minute", "count per minute", starts,
            [Line("handed over", tuple(minute.handed_over for minute in trends.minutes), "#1f5fbf"),
             Line("sent", tuple(minute.sent for minute in trends.minutes), "#b35900", "7 4"),
             Line("settled", tuple(minute.settled for minute in trends.minutes), "#1e7b3a", "2 3")], totals=True),
        backlog=per_minute_chart(
            "trend-backlog", "Backlog: handed over and not ended", "notifications", starts,
            [Line("backlog", tuple(minute.backlog for minute in trends.minutes), "#6b3fa0")], totals=False),
        latency=latency_chart("trend-latency", "Settle latency by route, p50 and p99", trends.latencies))


def per_minute_chart(chart_id: str, title: str, unit: str, starts: Sequence[datetime], lines: Sequence[Line], *,
                     totals: bool) -> Markup:
    """Lines over the minutes beginning at ``starts`` (UTC), y from 0 in ``unit``. ``totals``: the
    legend gives each line's sum over the hour (counts per minute add up; a backlog does not, so
    it gives the last value, now)."""
    if not starts or not any(value for line in lines for value in line.values):
        return _empty(chart_id, title)
    marks = axis(max(max(line.values) for line in lines), COUNT_STEPS)
    top = marks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(index: int) -> float:
        return LEFT + plot_w * index / max(1, len(starts) - 1)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / top)

    said = [f"{line.label}: {sum(line.values)}" if totals else f"{line.label} now: {line.values[-1]}" for line in lines]
    span = f"{_clock(starts[0])} to {_clock(starts[-1])} UTC"
    parts = [_open(chart_id, title, f"Per minute from {span}; " + ("in the hour, " if totals else "") + ", ".join(said) + ".")]
    if totals:
        parts.append(f'<text x="{LEFT + 170 * len(lines)}" y="{LEGEND_Y}" font-size="11" fill="{MUTED}">(totals of the hour)</text>')
    for tick in marks:  # horizontal grid with the count it marks
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="{GRID}"/>'
                     f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" font-size="11" fill="{MUTED}">{tick:g}</text>')
    for index, start in enumerate(starts):
        if start.minute % 15 == 0:  # a time every quarter hour
            parts.append(f'<line x1="{x(index):.1f}" x2="{x(index):.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 4}" '
                         f'stroke="{MUTED}"/><text x="{x(index):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" '
                         f'font-size="11" fill="{MUTED}">{_clock(start)}</text>')
    parts.append(_axes(plot_h, "minute (UTC)", unit))
    for number, line in enumerate(lines):
        points = " ".join(f"{x(index):.1f},{y(value):.1f}" for index, value in enumerate(line.values))
        dash = f' stroke-dasharray="{escape(line.dash)}"' if line.dash else ""
        parts.append(f'<g class="series" data-series="{escape(line.label)}">'
                     f'<polyline fill="none" stroke="{escape(line.colour)}" stroke-width="2"{dash} points="{points}"/>')
        parts += [f'<circle cx="{x(index):.1f}" cy="{y(value):.1f}" r="3" fill="{escape(line.colour)}">'
                  f'<title>{_clock(starts[index])} UTC: {escape(line.label)} {value}</title></circle>'
                  for index, value in enumerate(line.values) if value]
        parts.append("</g>")
        parts.append(_legend_entry(number, line, said[number]))
    parts.append("</svg>")
    return Markup("".join(parts))


def latency_chart(chart_id: str, title: str, latencies: Sequence[RouteLatency]) -> Markup:
    """Two bars per route, p50 and p99, on one scale from 0 seconds, each with its value written."""
    if not latencies:
        return _empty(chart_id, title)
    row_h, label_w = 34, 130
    height = TOP + row_h * len(latencies) + BOTTOM
    plot_w = WIDTH - LEFT - label_w - RIGHT - 60  # room on the right for the longest value
    marks = axis(max(route.p99_s for route in latencies), DURATION_STEPS)
    top = marks[-1]
    x0 = LEFT + label_w - 40

    def width(seconds: float) -> float:
        return plot_w * seconds / top

    summary = "; ".join(f"{route.route}: p50 {duration(route.p50_s)}, p99 {duration(route.p99_s)} "
                        f"over {route.settled} settled" for route in latencies)
    parts = [_open(chart_id, title, f"From hand-over to settled, the hour's notifications by route: {summary}.",
                   height=height)]
    for tick in marks:
        parts.append(f'<line x1="{x0 + width(tick):.1f}" x2="{x0 + width(tick):.1f}" y1="{TOP}" '
                     f'y2="{height - BOTTOM}" stroke="{GRID}"/><text x="{x0 + width(tick):.1f}" y="{height - BOTTOM + 16}" '
                     f'text-anchor="middle" font-size="11" fill="{MUTED}">{duration(tick)}</text>')
    parts.append(f'<text x="{x0 + plot_w / 2:.1f}" y="{height - 8}" text-anchor="middle" font-size="12" fill="{INK}">'
                 f'settle latency, from hand-over to delivered, read or failed; (n) settled in the hour</text>')
    for row, route in enumerate(latencies):
        y = TOP + row * row_h
        name = escape(route.route)
        parts.append(f'<g class="route" data-route="{name}"><text x="{x0 - 8}" y="{y + 17}" text-anchor="end" '
                     f'font-size="12" fill="{INK}">{name} ({route.settled})</text>')
        for offset, (which, seconds, colour) in enumerate((("p50", route.p50_s, "#1f5fbf"), ("p99", route.p99_s, "#b35900"))):
            top_y = y + 4 + offset * 13
            parts.append(f'<rect x="{x0}" y="{top_y}" width="{max(1.0, width(seconds)):.1f}" height="11" fill="{colour}">'
                         f'<title>{name} {which}: {duration(seconds)} over {route.settled} settled</title></rect>'
                         f'<text x="{x0 + max(1.0, width(seconds)) + 4:.1f}" y="{top_y + 10}" font-size="11" '
                         f'fill="{INK}">{which} {duration(seconds)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return Markup("".join(parts))


# Round steps for an axis: counts by 1, 2 or 5 times a power of ten; durations also by the
# steps of a clock (15 s, 30 s, 1 min, 2 min, 5 min, ...), so a latency axis reads 0, 1 min, 2 min.
COUNT_STEPS = tuple(size * 10 ** power for power in range(0, 9) for size in (1, 2, 5))
DURATION_STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900,
                  1800, 3600, 7200, 14400, 21600, 43200, 86400, *(86400 * days for days in (2, 5, 10, 20, 50, 100)))


def axis(largest: float, steps: Sequence[float]) -> list[float]:
    """The ticks of an axis from 0 that reaches ``largest``: the smallest of ``steps`` that needs
    four ticks or fewer past 0 (the largest step when none does); the last tick is the top."""
    step = next((size for size in steps if size * 4 >= largest), steps[-1])
    return [step * index for index in range(max(1, math.ceil(largest / step - 1e-9)) + 1)]


def duration(seconds: float) -> str:
    """A latency in the unit an operator reads it in: ms, s, min or h."""
    if seconds == 0:
        return "0"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def _clock(at: datetime) -> str:
    return at.strftime("%H:%M")


def _open(chart_id: str, title: str, description: str, *, height: int = HEIGHT) -> str:
    chart_id = escape(chart_id)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{chart_id}" role="img" '
            f'aria-labelledby="{chart_id}-title {chart_id}-desc" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
            f'height="{height}" font-family="system-ui, sans-serif"><title id="{chart_id}-title">{escape(title)}</title>'
            f'<desc id="{chart_id}-desc">{escape(description)}</desc>'
            f'<text x="{LEFT}" y="{TITLE_Y}" font-size="13" font-weight="600" fill="{INK}">{escape(title)}</text>')


def _empty(chart_id: str, title: str) -> Markup:
    return Markup(_open(chart_id, title, NOTHING, height=70)
                  + f'<text class="nothing" x="{LEFT}" y="46" font-size="13" fill="{MUTED}">{NOTHING}</text></svg>')


def _axes(plot_h: int, x_label: str, y_label: str) -> str:
    bottom = TOP + plot_h
    return (f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}" stroke="{INK}"/>'
            f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}" stroke="{INK}"/>'
            f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle" font-size="12" '
            f'fill="{INK}">{escape(x_label)}</text>'
            f'<text transform="translate(14 {TOP + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle" font-size="12" '
            f'fill="{INK}">{escape(y_label)}</text>')


def _legend_entry(number: int, line: Line, said: str) -> str:
    x = LEFT + 170 * number
    dash = f' stroke-dasharray="{escape(line.dash)}"' if line.dash else ""
    return (f'<g class="legend"><line x1="{x}" x2="{x + 22}" y1="{LEGEND_Y - 4}" y2="{LEGEND_Y - 4}" '
            f'stroke="{escape(line.colour)}" stroke-width="2"{dash}/>'
            f'<text x="{x + 27}" y="{LEGEND_Y}" font-size="12" fill="{INK}">{escape(said)}</text></g>')
