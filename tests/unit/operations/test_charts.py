"""The overview's SVG charts: points land where their values say, an empty hour says so, every
text is escaped, each chart names itself for a screen reader, and the axes are labelled with their
units; the trends' pure parts (the per-minute summary, the nearest-rank percentile) beside them."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from dispatcher.lifecycle import trends
from dispatcher.lifecycle.trends import Life, RouteLatency
from dispatcher.operations.dashboard import charts
from dispatcher.operations.dashboard.charts import Line

SVG = "{http://www.w3.org/2000/svg}"
SINCE = datetime(2026, 11, 25, 11, 1, tzinfo=UTC)
STARTS = [SINCE + index * trends.MINUTE for index in range(trends.MINUTES)]


def parse(markup: str) -> ET.Element:
    return ET.fromstring(markup)  # well-formed XML, or this fails


def values(pairs: dict[int, int]) -> tuple[int, ...]:
    return tuple(pairs.get(index, 0) for index in range(trends.MINUTES))


def test_points_map_to_their_minute_and_value() -> None:
    svg = parse(charts.per_minute_chart("c", "Rates", "count per minute", STARTS,
                                        [Line("handed over", values({0: 4, 30: 2, 59: 1}), "#000")], totals=True))
    # the axis reaches 4 in steps of 1; the plot spans LEFT..WIDTH-RIGHT across, TOP..HEIGHT-BOTTOM down
    plot_w, plot_h = charts.WIDTH - charts.LEFT - charts.RIGHT, charts.HEIGHT - charts.TOP - charts.BOTTOM
    circles = {(float(c.get("cx", "")), float(c.get("cy", ""))): (c.findtext(f"{SVG}title") or "")
               for c in svg.iter(f"{SVG}circle")}
    assert circles == {
        (charts.LEFT, charts.TOP): "11:01 UTC: handed over 4",
        (round(charts.LEFT + plot_w * 30 / 59, 1), charts.TOP + plot_h / 2): "11:31 UTC: handed over 2",
        (charts.WIDTH - charts.RIGHT, charts.TOP + plot_h * 3 / 4): "12:00 UTC: handed over 1",
    }
    polyline = svg.find(f".//{SVG}polyline")
    assert polyline is not None and len(polyline.get("points", "").split()) == 60  # zeros drawn, without a point
    assert [t.text for t in svg.iter(f"{SVG}text") if t.text and t.text.isdigit()] == ["0", "1", "2", "3", "4"]


def test_the_chart_names_itself_and_labels_its_axes() -> None:
    svg = parse(charts.per_minute_chart("rates", "Rates", "count per minute", STARTS,
                                        [Line("sent", values({5: 3}), "#000", "7 4"), Line("settled", values({6: 1}), "#111")],
                                        totals=True))
    assert svg.get("role") == "img" and svg.get("aria-labelledby") == "rates-title rates-desc"
    assert svg.findtext(f"{SVG}title") == "Rates"
    assert svg.findtext(f"{SVG}desc") == "Per minute from 11:01 to 12:00 UTC; in the hour, sent: 3, settled: 1."
    texts = [t.text for t in svg.iter(f"{SVG}text")]
    assert {"minute (UTC)", "count per minute", "sent: 3", "settled: 1", "11:15", "11:30", "11:45", "12:00"} <= set(texts)
    assert [g.get("data-series") for g in svg.iter(f"{SVG}g") if g.get("class") == "series"] == ["sent", "settled"]
    backlog = parse(charts.per_minute_chart("b", "Backlog", "notifications", STARTS,
                                            [Line("backlog", values({0: 5, 59: 2}), "#000")], totals=False))
    assert "backlog now: 2" in [t.text for t in backlog.iter(f"{SVG}text")]  # a backlog does not add up


def test_an_empty_hour_says_nothing_happened() -> None:
    for markup in (charts.per_minute_chart("e", "Rates", "count", STARTS, [Line("sent", values({}), "#000")], totals=True),
                   charts.latency_chart("l", "Latency", [])):
        svg = parse(markup)
        assert [t.text for t in svg.iter(f"{SVG}text")][-1] == "Nothing in the last hour."
        assert svg.findtext(f"{SVG}desc") == "Nothing in the last hour." and svg.find(f".//{SVG}circle") is None


def test_every_text_is_escaped() -> None:
    hostile = '<script>alert("x")</script> & "q"'
    latency = str(charts.latency_chart("l", "Latency", [RouteLatency(hostile, 3, 1.5, 90.0)]))
    rates = str(charts.per_minute_chart("r", hostile, "count", STARTS, [Line(hostile, values({1: 1}), "#000")], totals=True))
    for markup in (latency, rates):
        assert "<script" not in markup and "&lt;script&gt;" in markup
        parse(markup)
    svg = parse(latency)
    assert [g.get("data-route") for g in svg.iter(f"{SVG}g")] == [hostile]  # the parser reads back the very name


def test_latency_bars_share_one_scale_and_say_their_values() -> None:
    svg = parse(charts.latency_chart("l", "Latency", [RouteLatency("reminders", 2, 60.0, 2420.0),
                                                      RouteLatency("sms", 1, 30.0, 30.0)]))
    widths = {(rect.findtext(f"{SVG}title") or ""): float(rect.get("width", "")) for rect in svg.iter(f"{SVG}rect")}
    assert list(widths) == ["reminders p50: 1 min over 2 settled", "reminders p99: 40.3 min over 2 settled",
                            "sms p50: 30 s over 1 settled", "sms p99: 30 s over 1 settled"]
    # one scale: the axis runs to 2700 s (45 min, in steps of 15) over the 458 px the bars have
    assert list(widths.values()) == [round(458 * 60 / 2700, 1), round(458 * 2420 / 2700, 1),
                                     round(458 * 30 / 2700, 1), round(458 * 30 / 2700, 1)]
    assert {"0", "15 min", "30 min", "45 min", "reminders (2)", "sms (1)"} <= {t.text for t in svg.iter(f"{SVG}text")}


def test_axis_steps_and_durations_read_round() -> None:
    assert charts.axis(4, charts.COUNT_STEPS) == [0, 1, 2, 3, 4]
    assert charts.axis(5, charts.COUNT_STEPS) == [0, 2, 4, 6]
    assert charts.axis(1, charts.COUNT_STEPS) == [0, 1]
    assert charts.axis(130, charts.COUNT_STEPS) == [0, 50, 100, 150]
    assert charts.axis(170, charts.DURATION_STEPS) == [0, 60, 120, 180]
    assert [charts.duration(s) for s in (0, 0.25, 1.5, 59, 60, 5400, 7200)] == [
        "0", "250 ms", "1.5 s", "59 s", "1 min", "90 min", "2 h"]


def test_draw_trends_shows_the_series_and_no_script() -> None:
    minutes = [trends.MinuteCounts(start, 1 if index == 10 else 0, 0, 0, 2) for index, start in enumerate(STARTS)]
    drawn = charts.draw_trends(trends.Trends(minutes, []))
    assert "handed over: 1" in drawn.per_minute and "backlog now: 2" in drawn.backlog
    assert "Nothing in the last hour." in drawn.latency
    assert not re.search(r"<script|\bon\w+=|javascript:|href=", drawn.per_minute + drawn.backlog + drawn.latency)


def test_summarise_counts_each_minute_and_the_backlog() -> None:
    handed = SINCE + timedelta(minutes=3, seconds=10)
    lives = [Life("r", handed, "delivered", handed + timedelta(minutes=2)),  # settles in minute 5
             Life("r", SINCE - timedelta(hours=2), "read", SINCE - timedelta(hours=1)),  # ended before the hour
             Life("s", SINCE + timedelta(minutes=59), "queued", None)]
    read = trends.summarise(since=SINCE, lives=lives, sent=[handed + timedelta(seconds=5), SINCE - trends.MINUTE],
                            open_before=1)
    assert [(m.handed_over, m.sent, m.settled) for m in read.minutes if (m.handed_over, m.sent, m.settled) != (0, 0, 0)] \
        == [(1, 1, 0), (0, 0, 1), (1, 0, 0)]
    assert [m.backlog for m in read.minutes] == [1] * 3 + [2] * 2 + [1] * 54 + [2]
    assert read.latencies == [RouteLatency("r", 1, 120.0, 120.0)]


def test_the_percentile_is_the_nearest_rank() -> None:
    hundred = [float(value) for value in range(100, 0, -1)]  # 1..100, out of order
    assert (trends.percentile(hundred, 50), trends.percentile(hundred, 99)) == (50.0, 99.0)
    assert trends.percentile([float(v) for v in range(1, 201)], 99) == 198.0
    assert (trends.percentile([7.0], 50), trends.percentile([7.0], 99)) == (7.0, 7.0)
    assert trends.percentile([1.0, 2.0, 3.0], 50) == 2.0 and trends.percentile([1.0, 2.0, 3.0], 99) == 3.0
