"""Every PromQL expression of the alert rules and of the Grafana dashboard names a metric the code
exports, and matches or groups only by labels that metric has: a renamed metric or label fails
here, not silently in an operator's empty panel or an alert that can never fire.

What the code exports is read from the code itself: the counters and histograms of
dispatcher.metrics, and every family the scrape-time collectors yield over a real SQLite store
with a notification in it, a tripped breaker and the example configuration's routes. The reader
of expressions (tests.support.promql_names) is tried on tricky ones first, so a reader that sees
nothing cannot pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from dispatcher import metrics
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.metrics import NotificationStates, RouteDeadlines, WorkspaceBreakers
from dispatcher.policy.breaker import LocalBreaker
from dispatcher.store.db import session_factory, shared_engine
from dispatcher.store.migrate import upgrade_database
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.promql_names import Unreadable, names_in

pytestmark = pytest.mark.integration

RULES = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dispatcher.json"
TARGET_LABELS = frozenset({"job", "instance"})  # Prometheus adds them to every series it scrapes
PROMETHEUS_OWN: dict[str, frozenset[str]] = {"up": frozenset()}  # a series Prometheus makes for each target


# --- the reader, on tricky expressions ---------------------------------------------------------


def test_the_reader_finds_metrics_labels_and_groupings_in_tricky_expressions() -> None:
    found = names_in('histogram_quantile(0.99, sum by (route, le) (rate(a_seconds_bucket{route!~"x|y,z"}[10m]))) '
                     '> on (route) group_left max by (route) (b_deadline)')
    assert found.metrics == {"a_seconds_bucket", "b_deadline"}
    assert found.matched == {"a_seconds_bucket": {"route"}}
    assert found.grouped == {"route", "le"}
    found = names_in('absent(up{job="w", instance=~".+"} == 1) and deriv(sum(c{state=~"queued|{sending}"})[5m:30s]) > 0 '
                     'or d offset 1h unless e[$__rate_interval] * 1e3')
    assert found.metrics == {"up", "c", "d", "e"}
    assert found.matched == {"up": {"job", "instance"}, "c": {"state"}}
    assert names_in("sum without (instance) (rate(f_total[${interval}]))").grouped == {"instance"}


@pytest.mark.parametrize("expression", [
    'sum(rat(a_total[5m]))',  # a misspelt function is not taken for anything else
    '{__name__="a"}',  # no metric name to check
    'a{route~="x"}',  # a matcher it cannot read
])
def test_the_reader_refuses_what_it_cannot_read(expression: str) -> None:
    with pytest.raises(Unreadable):
        names_in(expression)


# --- what the code exports ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, frozenset[str]]:
    """Every series name the code exports, with its labels (a histogram's _bucket with le)."""
    catalogue: dict[str, frozenset[str]] = dict(PROMETHEUS_OWN)
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            # the wrappers' label names: private in prometheus_client, and nothing is observed to read them
            name, labels = value._name, frozenset(value._labelnames)  # noqa: SLF001
            if value._type == "counter":  # noqa: SLF001
                catalogue[f"{name}_total"] = labels
            elif value._type == "histogram":  # noqa: SLF001
                catalogue |= {f"{name}_bucket": labels | {"le"}, f"{name}_sum": labels, f"{name}_count": labels}
            else:
                catalogue[name] = labels
    for family in _collected(tmp_path_factory.mktemp("exports")):
        assert family.samples, f"{family.name} yielded no sample: its labels cannot be read"
        catalogue[family.name] = frozenset().union(*(sample.labels for sample in family.samples))
    return catalogue


def _collected(folder: Path) -> Iterator[Metric]:
    url = f"sqlite:///{folder}/exports.sqlite"
    upgrade_database(url)
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=url)
    sessions = session_factory(shared_engine(url))
    intake.accept(parse_request(reminder("exports-1", identifier="exports-p1", phone="+15550480001")),
                  sessions=sessions, settings=settings, enqueuer=ListEnqueuer())
    breaker = LocalBreaker()
    breaker.trip("auth", "the workspace refused the API token (HTTP 401)")
    collectors: list[Collector] = [NotificationStates(sessions), WorkspaceBreakers({"default": breaker}),
                                   RouteDeadlines(settings.routes)]
    for collector in collectors:
        yield from collector.collect()


def test_the_catalogue_holds_what_the_alerts_need(exported: dict[str, frozenset[str]]) -> None:
    assert exported["dispatcher_workspace_paused"] == {"workspace", "reason"}
    assert exported["dispatcher_delivery_latency_seconds_bucket"] == {"route", "le"}
    assert exported["dispatcher_route_delivery_deadline_seconds"] == {"route"}
    assert exported["dispatcher_notifications"] == {"state"}
    assert exported["dispatcher_send_results_total"] == {"result"}


# --- the expressions of deploy/ ----------------------------------------------------------------


def rule_expressions() -> list[tuple[str, str]]:
    rules = yaml.safe_load(RULES.read_text())
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[tuple[str, str]]:
    def panels(within: list[dict[str, object]]) -> Iterator[dict[str, object]]:
        for panel in within:
            yield panel
            yield from panels(panel.get("panels", []))  # type: ignore[arg-type]

    dashboard = json.loads(DASHBOARD.read_text())
    return [(f"{panel['title']} {target['refId']}", target["expr"])
            for panel in panels(dashboard["panels"]) for target in panel.get("targets", [])]  # type: ignore[attr-defined]


def test_there_are_expressions_to_check() -> None:
    assert len(rule_expressions()) == 7
    assert len(dashboard_expressions()) >= 15


@pytest.mark.parametrize(("where", "expression"), [*rule_expressions(), *dashboard_expressions()])
def test_each_expression_names_exported_metrics_and_their_labels(where: str, expression: str,
                                                                 exported: dict[str, frozenset[str]]) -> None:
    found = names_in(expression)
    assert found.metrics, f"{where}: no metric found in {expression!r}"
    unknown = sorted(found.metrics - set(exported))
    assert unknown == [], f"{where}: the code exports no {unknown}"
    for metric, labels in found.matched.items():
        foreign = sorted(labels - exported[metric] - TARGET_LABELS)
        assert foreign == [], f"{where}: {metric} has no label {foreign}"
    available = frozenset().union(*(exported[metric] for metric in found.metrics)) | TARGET_LABELS
    assert sorted(found.grouped - available) == [], f"{where}: grouped by labels none of its metrics has"


def test_a_metric_the_code_does_not_export_is_caught(exported: dict[str, frozenset[str]]) -> None:
    """The check can fail: a renamed metric, and a label the metric does not have."""
    renamed = names_in("max by (workspace) (dispatcher_workspace_pause)")
    assert renamed.metrics - set(exported) == {"dispatcher_workspace_pause"}
    wrong_label = names_in('dispatcher_notifications{status="queued"}')
    assert wrong_label.matched["dispatcher_notifications"] - exported["dispatcher_notifications"] == {"status"}
