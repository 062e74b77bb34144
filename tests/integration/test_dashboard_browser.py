"""The operators' dashboard in a real browser: Playwright drives Debian's chromium over the
dashboard served as a process (``dispatcher dashboard``), on a store filled by the real send path
against the sandbox process. The page loads behind the operator token, the filters narrow the
list, the overview draws the last hour's trends with what the test handed over, the timeline of a
notification that fell back shows every step, the cancel action works, and no page shows the
contents or phone numbers the test sent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from dispatcher.context import SendContext
from dispatcher.enqueue import ListEnqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake.request import parse_request
from dispatcher.sending.send import Outcome
from dispatcher.store import queries as store
from tests.conftest import REPO_ROOT
from tests.support.dispatcher_setup import drive, example_settings, reminder, send_context
from tests.support.ports import listens
from tests.support.sandbox_process import SandboxProcess, free_port, running_sandbox
from tests.support.worker_process import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKEN = "operator-token-for-the-browser-test"
SERVER_ERRORS = {"createMessage": {"server_error_share": 1.0}}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Quiet flags for a closed network (docs: the env notes): no background connections, no sandbox as root.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@dataclass
class Store:
    sandbox: SandboxProcess
    context: SendContext
    sent: list[str]  # every content and phone number handed over: none may show on a page

    def hand_over(self, event_id: str, phone: str, **changes: object) -> int:
        request = {**reminder(event_id, identifier=f"p-{event_id}", phone=phone,
                              content=f"Reminder {event_id}: your HIV test result is ready"), **changes}
        self.sent += [str(request["content"]), phone, phone.removeprefix("+")]
        intake.accept(parse_request(request), sessions=self.context.sessions, settings=self.context.settings,
                      enqueuer=ListEnqueuer())
        with self.context.sessions() as session:
            found = store.find_notification_by_event(session, event_id)
            assert found is not None
            return found.id


@pytest.fixture()
def filled(tmp_path: Path, clean_environment: pytest.MonkeyPatch) -> Iterator[Store]:
    """A store with a notification that fell back to SMS, two sent, one failed and one scheduled."""
    with running_sandbox() as sandbox:
        settings = example_settings(api_url=sandbox.base_url, database_url=f"sqlite:///{tmp_path}/dashboard.sqlite")
        with send_context(settings) as context:
            filled = Store(sandbox, context, [])
            fell_back = filled.hand_over("dash-fell-back", "+15550410001")
            sandbox.set_faults(SERVER_ERRORS)
            drive(context, fell_back)  # the first attempt fails: the SMS fallback is decided
            failed = filled.hand_over("dash-failed", "+15550410002", route="sms")
            assert drive(context, failed)[-1].outcome is Outcome.FAILED
            sandbox.set_faults({})
            assert drive(context, fell_back)[-1].outcome is Outcome.ACCEPTED
            for number in range(2):
                assert drive(context, filled.hand_over(f"dash-sent-{number}", f"+1555041010{number}"))[-1].outcome \
                    is Outcome.ACCEPTED
            filled.hand_over("dash-scheduled", "+15550410009",
                             send_at=(datetime.now(UTC) + timedelta(days=2)).isoformat())
            yield filled


@pytest.fixture()
def dashboard(filled: Store, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("DISPATCHER_")}
    env.update(DISPATCHER_CONFIG=str(REPO_ROOT / "config" / "dispatcher.example.toml"),
               DISPATCHER_API_URL=filled.sandbox.base_url, DISPATCHER_DATABASE_URL=filled.context.settings.database_url,
               DISPATCHER_BROKER_URL=f"filesystem://{tmp_path}/broker", DISPATCHER_OPERATOR_TOKEN=TOKEN,
               DISPATCHER_FLOWER_URL="http://127.0.0.1:5555", PYTHONPATH=str(REPO_ROOT))
    log = (tmp_path / "dashboard.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "dispatcher", "dashboard", "--port", str(port)], cwd=REPO_ROOT,
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(base) and listens(process.pid, port), timeout_s=30, what="the dashboard")
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def _answers(base: str) -> bool:
    try:
        return httpx.get(base, timeout=1).status_code == 401
    except httpx.TransportError:
        return False


@pytest.fixture()
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "chromium is missing: scripts/test installs Debian's package"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _shows_nothing_sent(page: Page, filled: Store) -> None:
    text = page.content()
    leaked = [value for value in filled.sent if value in text]
    assert not leaked, leaked


def _counted(titles: list[str]) -> int:
    """The sum of the counts a chart's points give in their titles ("11:04 UTC: sent 2")."""
    return sum(int(title.rsplit(" ", 1)[1]) for title in titles)


def test_the_dashboard_in_a_browser(dashboard: str, browser: Browser, filled: Store, tmp_path: Path) -> None:
    # Without the operator token nothing is shown, and a form from elsewhere is refused
    assert httpx.get(f"{dashboard}/notifications").status_code == 401
    forged = httpx.post(f"{dashboard}/notification/cancel?event=dash-scheduled", auth=("any", TOKEN),
                        data={"form_token": "not-ours"})
    assert forged.status_code == 403
    page = browser.new_context(http_credentials={"username": "operator", "password": TOKEN},
                               base_url=dashboard).new_page()

    # The overview counts by state and by error kind, and links to Flower
    page.goto("/")
    assert page.locator("[data-state=failed] b").inner_text() == "1"
    assert page.locator("[data-state=scheduled] b").inner_text() == "1"
    assert "not_found_after_unknown_outcome" in page.locator("#errors").inner_text()
    assert page.get_by_role("link", name="Workers in Flower").get_attribute("href") == "http://127.0.0.1:5555"
    _shows_nothing_sent(page, filled)

    # The last hour's trends, drawn on the server: five handed over, three messages accepted (the
    # fallback and the two sent), one settled (the failed one), four not ended (those three and the
    # scheduled one); a point per minute with its count, and the one failure's latency on its route
    assert page.locator("#trends svg[role=img]").count() == 3
    rates = page.get_by_role("img", name="Handed over, sent and settled per minute")
    assert [series.get_attribute("data-series") for series in rates.locator("g.series").all()] \
        == ["handed over", "sent", "settled"]
    assert {"handed over: 5", "sent: 3", "settled: 1"} <= set(rates.locator("g.legend text").all_text_contents())
    assert {name: _counted(rates.locator(f"g[data-series='{name}'] circle title").all_text_contents())
            for name in ("handed over", "sent", "settled")} == {"handed over": 5, "sent": 3, "settled": 1}
    backlog = page.get_by_role("img", name="Backlog: handed over and not ended")
    assert backlog.locator("g.legend text").text_content() == "backlog now: 4"
    latency = page.get_by_role("img", name="Settle latency by route, p50 and p99")
    assert [route.get_attribute("data-route") for route in latency.locator("g.route").all()] == ["sms"]
    trends_markup = page.locator("#trends").inner_html()
    assert "<script" not in trends_markup and not [value for value in filled.sent if value in trends_markup]
    page.screenshot(path=str(tmp_path / "dashboard-trends.png"), full_page=True)
    if os.environ.get("DISPATCHER_TEST_TRENDS_SCREENSHOT"):  # docs/dashboard-trends.png is made this way
        shutil.copy(tmp_path / "dashboard-trends.png", os.environ["DISPATCHER_TEST_TRENDS_SCREENSHOT"])

    # The filters narrow the list
    page.goto("/notifications")
    assert page.locator("#notifications tr[data-event]").count() == 5
    page.select_option("select[name=state]", "failed")
    page.click("button[type=submit]")
    page.wait_for_load_state()  # the filtered page, whole
    assert [row.get_attribute("data-event") for row in page.locator("#notifications tr[data-event]").all()] \
        == ["dash-failed"]
    page.goto("/notifications?route=reminders&since=1h")
    assert sorted(row.get_attribute("data-event") or "" for row in page.locator("#notifications tr[data-event]").all()) \
        == ["dash-fell-back", "dash-scheduled", "dash-sent-0", "dash-sent-1"]
    _shows_nothing_sent(page, filled)

    # The timeline of the notification that fell back shows each step, in order
    page.goto("/notifications?event=dash-fell-back")
    page.click("text=dash-fell-back")
    page.wait_for_load_state()
    steps = [row.inner_text().split("\t")[1] for row in page.locator("#timeline tr").all()[1:]]
    wanted = ["handed over", "attempt 1 opened", "attempt 1 claimed", "attempt 1 failed",
              "fallback decision: fallback", "attempt 2 opened", "attempt 2 claimed", "attempt 2 accepted"]
    assert [step for step in steps if step in wanted] == wanted, steps
    assert page.locator("#state").inner_text() in ("accepted", "sent")
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
    if os.environ.get("DISPATCHER_TEST_SCREENSHOT"):  # docs/dashboard.png is made this way
        shutil.copy(tmp_path / "dashboard.png", os.environ["DISPATCHER_TEST_SCREENSHOT"])
    _shows_nothing_sent(page, filled)

    # An action works: the scheduled one is cancelled, and nothing of it will be sent
    page.goto("/notification?event=dash-scheduled")
    page.click("#cancel")
    page.wait_for_load_state()  # the answer page after the redirect
    assert "Cancelled" in page.locator("#done").inner_text()
    assert page.locator("#state").inner_text() == "cancelled"
    assert intake.status(filled.context.sessions, "dash-scheduled").state == "cancelled"
    assert page.locator("#cancel").count() == 0
    _shows_nothing_sent(page, filled)
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    assert (tmp_path / "dashboard-trends.png").stat().st_size > 10_000
