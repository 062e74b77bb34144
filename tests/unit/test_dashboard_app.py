"""The dashboard's pages without a browser: the operator token guards every page and action, a
filter that is not one is answered 400 naming it, the overview draws the last hour, forms from
elsewhere are refused, the command refuses to start without a token, and a timeline keeps the
order of one instant's steps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from dispatcher.enqueue import ListEnqueuer
from dispatcher.errors import ConfigurationError
from dispatcher.operations.cli import exits
from dispatcher.operations.cli.main import cli
from dispatcher.operations.dashboard.app import create_dashboard_app
from dispatcher.policy.breaker import LocalBreaker
from dispatcher.service import Dispatcher
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import example_settings, reminder
from tests.unit.http_intake.conftest import TestClient

TOKEN = "operator-token-0123456789"
PHONE = "+15550477001"


@pytest.fixture()
def dashboard(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, Dispatcher]]:
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=f"sqlite:///{tmp_path}/dash.sqlite")
    dispatcher = Dispatcher(settings, enqueuer=ListEnqueuer(), migrate=True)
    breaker = LocalBreaker()
    breaker.trip("auth", "the workspace refused the API token")
    app = create_dashboard_app(dispatcher, token=TOKEN, breakers={"default": breaker, "north": LocalBreaker()})
    with TestClient(app) as client:
        yield client, dispatcher


def test_every_page_and_action_needs_the_operator_token(dashboard: tuple[TestClient, Dispatcher]) -> None:
    client, _ = dashboard
    for path in ("/", "/notifications", "/notification?event=x", "/set-aside"):
        refused = client.get(path)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
        assert client.get(path, auth=("operator", "not-the-token-at-all")).status_code == 401
    assert client.post("/notification/cancel?event=x", data={"form_token": "x"}).status_code == 401
    assert client.get("/", auth=("anyone", TOKEN)).status_code == 200


def test_the_overview_shows_the_paused_workspace(dashboard: tuple[TestClient, Dispatcher]) -> None:
    client, dispatcher = dashboard
    dispatcher.notify(reminder("dash-unit-1", identifier="p-1", phone=PHONE))
    page = client.get("/", auth=("operator", TOKEN))
    assert "default" in page.text and "the workspace refused the API token" in page.text
    assert "north</td>" not in page.text  # its breaker is closed
    assert 'data-state="queued"' in page.text and PHONE not in page.text
    assert page.headers["cache-control"] == "no-store" and "script-src" not in page.headers["content-security-policy"]


def test_the_overview_draws_the_last_hour(dashboard: tuple[TestClient, Dispatcher]) -> None:
    client, dispatcher = dashboard
    assert client.get("/", auth=("operator", TOKEN)).text.count('class="nothing"') == 3  # an empty store: all three
    dispatcher.notify(reminder("dash-unit-trend", identifier="p-3", phone=PHONE))
    page = client.get("/", auth=("operator", TOKEN)).text
    assert 'id="trend-rates"' in page and "handed over: 1" in page and "backlog now: 1" in page
    assert page.count('class="nothing"') == 1  # nothing settled: no latency yet
    assert PHONE not in page and "<script" not in page


def test_a_filter_that_is_not_one_is_answered_400_naming_it(dashboard: tuple[TestClient, Dispatcher]) -> None:
    client, _ = dashboard
    for query, field in (("state=bogus", "state:"), ("since=yesterday", "since:"), ("before=-3", "before:")):
        answer = client.get(f"/notifications?{query}", auth=("operator", TOKEN))
        assert answer.status_code == 400 and field in answer.text, query


def test_a_form_from_elsewhere_changes_nothing(dashboard: tuple[TestClient, Dispatcher]) -> None:
    client, dispatcher = dashboard
    dispatcher.notify({**reminder("dash-unit-2", identifier="p-2", phone=PHONE), "send_at": "2099-01-01T08:00:00+00:00"})
    forged = client.post("/notification/cancel?event=dash-unit-2", auth=("operator", TOKEN), data={"form_token": "guess"})
    assert forged.status_code == 403 and dispatcher.status("dash-unit-2").state == "scheduled"
    page = client.get("/notification?event=dash-unit-2", auth=("operator", TOKEN))
    token = page.text.split('name="form_token" value="')[1].split('"')[0]
    done = client.post("/notification/cancel?event=dash-unit-2", auth=("operator", TOKEN), data={"form_token": token},
                       follow_redirects=False)
    assert done.status_code == 303 and dispatcher.status("dash-unit-2").state == "cancelled"
    assert client.get(done.headers["location"], auth=("operator", TOKEN)).text.count("Cancelled: nothing of it is sent") == 1


def test_without_an_operator_token_there_is_no_dashboard(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=f"sqlite:///{tmp_path}/none.sqlite")
    with pytest.raises(ConfigurationError, match="DISPATCHER_OPERATOR_TOKEN"):
        create_dashboard_app(Dispatcher(settings, enqueuer=ListEnqueuer()), token=None)
    result = CliRunner().invoke(cli, ["dashboard"], env={"DISPATCHER_CONFIG": str(REPO_ROOT / "config" /
                                                                                  "dispatcher.example.toml")})
    assert result.exit_code == exits.CONFIGURATION
    assert result.output.strip() == ("error: DISPATCHER_OPERATOR_TOKEN (operator_token): is required to serve "
                                     "the dashboard")
    short = CliRunner().invoke(cli, ["dashboard"], env={"DISPATCHER_CONFIG": str(REPO_ROOT / "config" /
                                                                                 "dispatcher.example.toml"),
                                                        "DISPATCHER_OPERATOR_TOKEN": "short"})
    assert short.exit_code == exits.CONFIGURATION and "short" not in short.output.replace("DISPATCHER_", "")


def test_odd_event_ids_reach_their_own_page_and_a_link_cannot_bring_its_own_words(
        dashboard: tuple[TestClient, Dispatcher]) -> None:
    client, dispatcher = dashboard
    for event_id in ("..", "a/cancel", "x?y=1&z#w"):
        dispatcher.notify(reminder(event_id, identifier="p-odd", phone=PHONE))
        listed = client.get("/notifications", params={"event": event_id}, auth=("operator", TOKEN)).text
        link = listed.split('<td><a href="')[1].split('"')[0].replace("&amp;", "&")
        page = client.get(link, auth=("operator", TOKEN))
        assert page.status_code == 200 and f"Notification {event_id}".replace("&", "&amp;") in page.text, event_id
    crafted = client.get("/notification", params={"event": "..", "done": "Call +15550199999 now"},
                         auth=("operator", TOKEN))
    assert "Call" not in crafted.text and 'id="done"' not in crafted.text


def test_extreme_filters_are_refused_not_crashed_on(dashboard: tuple[TestClient, Dispatcher]) -> None:
    client, _ = dashboard
    for query in ("since=99999999999h", "since=0001-01-01T00:00%2B05:00", "before=99999999999999999999"):
        assert client.get(f"/notifications?{query}", auth=("operator", TOKEN)).status_code == 400, query


def test_without_a_shared_breaker_the_overview_says_so(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> None:
    settings = example_settings(api_url="http://127.0.0.1:9", database_url=f"sqlite:///{tmp_path}/nob.sqlite")
    app = create_dashboard_app(Dispatcher(settings, enqueuer=ListEnqueuer(), migrate=True), token=TOKEN)
    with TestClient(app) as client:
        assert "Circuit breaker not shown" in client.get("/", auth=("operator", TOKEN)).text


def test_a_store_that_does_not_answer_is_a_503_not_a_traceback(dashboard: tuple[TestClient, Dispatcher],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy.exc import OperationalError

    client, dispatcher = dashboard

    def down() -> None:
        raise OperationalError("SELECT secret", {}, Exception("no route"))

    monkeypatch.setattr(dispatcher, "sessions", down)
    answer = client.get("/notifications", auth=("operator", TOKEN))
    assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
    assert answer.text == "the store did not answer (OperationalError); try again"
