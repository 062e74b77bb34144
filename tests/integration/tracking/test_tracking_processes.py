"""Delivery tracking with every part real: the sandbox delivers signed webhooks to the receiver
process, two consumer processes apply them, a send worker sends (and sends fallbacks), beat runs
the sweeps; Redis is the broker, PostgreSQL the store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from dispatcher.api import WorkspaceClient
from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.queues import TRACKING_SWEEP_TASK
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings
from dispatcher.store.migrate import upgrade_database
from dispatcher.tracking.reconcile import DELIVERY_GRACE_S
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.ports import listens
from tests.support.sandbox_process import SandboxProcess, free_port, running_sandbox
from tests.support.store_scan import kept_anywhere
from tests.support.tcp_proxy import tcp_proxy
from tests.support.worker_process import ProcessGroup, dispatcher_environment, fresh_broker_url, process_group, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BEHAVIOUR = """
[behaviour]
delivered_after_s = 0.2
read_after_s = 0.3
failed_after_s = 0.1
"""
UNRULY_WEBHOOKS = BEHAVIOUR + """
[webhooks]
delay_s = 0.05
duplicate_share = 0.3
reorder_share = 0.3
reorder_hold_s = 0.5
"""
NO_WEBHOOKS = BEHAVIOUR + """
[webhooks]
drop_share = 1.0
"""
# Our registry claims test_results_ready takes 2 body parameters; the platform approved 1.
TEMPLATES = [
    {"name": "appointment_reminder", "language": "en", "category": "UTILITY", "body_params": 2},
    {"name": "test_results_ready", "language": "en", "category": "UTILITY", "body_params": 2},
]


def _routes(deadline_s: float) -> str:
    routes = example_settings(api_url="http://x").model_dump(mode="json")["routes"]
    routes["reminders"]["delivery_deadline_s"] = deadline_s
    return json.dumps(routes)


class Stack:
    def __init__(self, group: ProcessGroup, dispatcher: Dispatcher, receiver_url: str, secret: str) -> None:
        self.group, self.dispatcher, self.receiver_url, self.secret = group, dispatcher, receiver_url, secret

    def status(self, event_id: str) -> Any:
        return self.dispatcher.status(event_id)


@pytest.fixture()
def stack_factory(
    fresh_postgres_url: str, redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> Iterator[Any]:
    opened: list[Any] = []

    def open_stack(sandbox: SandboxProcess, *, consumers: int = 2, database_url: str | None = None,
                   **overrides: str) -> Stack:
        """``database_url``: where the processes find the store (a proxy, say); the host's own
        Dispatcher always uses the store directly."""
        broker_url = fresh_broker_url(redis_url)
        upgrade_database(fresh_postgres_url)
        receiver_port = free_port()
        env = dispatcher_environment(
            api_url=sandbox.base_url, database_url=database_url or fresh_postgres_url, broker_url=broker_url,
            **{"DISPATCHER_TEMPLATES": json.dumps(TEMPLATES), **overrides},
        )
        settings = _settings({**env, "DISPATCHER_DATABASE_URL": fresh_postgres_url})
        with WorkspaceClient.from_settings(settings) as client:
            webhook = client.create_webhook(
                url=f"http://127.0.0.1:{receiver_port}{settings.webhook_path}", subscriptions=["message_created", "message_updated"]
            )
        assert webhook.secret is not None
        env["DISPATCHER_WEBHOOK_SECRETS"] = webhook.secret.get_secret_value()
        context = process_group(env, tmp_path)
        group = context.__enter__()
        opened.append(context)
        receiver = group.start("receiver", ["-m", "dispatcher", "receiver", "--host", "127.0.0.1", "--port",
                                            str(receiver_port)])
        group.start_worker("sender", concurrency=2)
        for number in range(consumers):
            group.start_worker(f"consumer{number}", concurrency=2, queues="dispatcher.outcomes")
        group.start_beat()
        wait_until(lambda: _answers(f"http://127.0.0.1:{receiver_port}/healthz") and listens(receiver.pid, receiver_port),
                   timeout_s=30, what="the receiver")
        dispatcher = Dispatcher(settings, enqueuer=CeleryEnqueuer(broker_url))
        return Stack(group, dispatcher, f"http://127.0.0.1:{receiver_port}{settings.webhook_path}",
                     webhook.secret.get_secret_value())

    yield open_stack
    for context in opened:
        context.__exit__(None, None, None)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _settings(env: dict[str, str]) -> Settings:
    overrides: dict[str, Any] = {key.removeprefix("DISPATCHER_").lower(): value for key, value in env.items()
                                 if key.startswith("DISPATCHER_") and key != "DISPATCHER_CONFIG"
                                 and not key.startswith("DISPATCHER_TEST_")}
    for key in ("templates", "routes"):
        if key in overrides:
            overrides[key] = json.loads(overrides[key])
    return example_settings(**overrides)


def _results_request(event_id: str, identifier: str, phone: str) -> dict[str, Any]:
    request = reminder(event_id, identifier=identifier, phone=phone)
    request["template"] = {"name": "test_results_ready", "language": "en", "category": "UTILITY",
                           "params": {"1": "Test Patient", "2": "today"}}
    return request


def _sms_messages_for(sandbox: SandboxProcess, event_id: str) -> int:
    return sum(1 for m in sandbox.messages() if m["inbox_id"] == 2 and (m.get("content") or "").startswith(f"Reminder {event_id}:"))


def test_every_outcome_ends_in_its_state_with_unruly_webhooks(stack_factory: Any) -> None:
    with running_sandbox(UNRULY_WEBHOOKS) as sandbox:
        stack = stack_factory(sandbox, DISPATCHER_ROUTES=_routes(4.0))
        # Given recipients the sandbox delivers, fails with 131026, fails with 132000 and never confirms
        with_email = reminder("ok-1", identifier="t-ok-1", phone="+15550501001")
        with_email["contact"]["email"] = "ann.patient@example.org"
        stack.dispatcher.notify(with_email)
        stack.dispatcher.notify(reminder("ok-2", identifier="t-ok-2", phone="+15550501002"))
        stack.dispatcher.notify(reminder("undeliverable", identifier="t-131026", phone="+15550107101"))
        stack.dispatcher.notify(_results_request("template", "t-132000", "+15550501003"))
        stack.dispatcher.notify(reminder("silent", identifier="t-silent", phone="+15550207102"))
        expected = {
            "ok-1": ("read", None),
            "ok-2": ("read", None),
            "undeliverable": ("delivered", "fallback"),  # on SMS (never read), after exactly one fallback
            "template": ("failed", "none"),
            "silent": ("sent", "fallback"),  # the deadline passed; SMS to it is never confirmed either
        }

        def settled() -> bool:
            stack.group.ensure_running()
            return all((stack.status(event).state, stack.status(event).fallback_decision) == want
                       for event, want in expected.items())

        try:
            wait_until(settled, timeout_s=90, what="every notification in its final state")
        finally:
            print({event: (stack.status(event).state, stack.status(event).fallback_reason) for event in expected})
        assert stack.status("undeliverable").fallback_reason == "undeliverable (131026)"
        assert stack.status("template").fallback_reason == "template_misconfigured (132000)"
        assert stack.status("silent").fallback_reason == "not delivered by the deadline"
        time.sleep(1.0)  # late duplicates and held-back deliveries arrive now
        assert _sms_messages_for(sandbox, "undeliverable") == 1
        assert _sms_messages_for(sandbox, "silent") == 1
        assert _sms_messages_for(sandbox, "ok-1") == 0
        webhooks = sandbox.stats()["webhooks"]
        assert webhooks.get("duplicated", 0) > 0 and webhooks.get("reordered", 0) > 0, webhooks
        # and, every send settled, no column keeps a phone number, an e-mail address, a name or a content
        phones = ["+15550501001", "+15550501002", "+15550107101", "+15550501003", "+15550207102"]
        contents = [message["content"] for message in sandbox.messages() if message.get("content")]
        assert contents, "the scan must look for what was really sent"
        needles = [*phones, *(phone.lstrip("+") for phone in phones), "ann.patient@example.org", "Test Patient",
                   *contents]
        assert kept_anywhere(stack.dispatcher.sessions, needles) == []


def test_a_hundred_copies_of_one_failure_to_two_consumers_make_one_decision(stack_factory: Any) -> None:
    with running_sandbox(BEHAVIOUR) as sandbox:
        stack = stack_factory(sandbox, consumers=2)
        stack.dispatcher.notify(reminder("storm", identifier="t-storm", phone="+15550107201"))
        wait_until(lambda: stack.status("storm").message_id is not None, timeout_s=30, what="the first send")
        message_id = stack.status("storm").message_id
        # 100 copies of the failure event, each under its own delivery ID, all at once
        body = json.dumps({"event": "message_updated", "id": message_id, "status": "failed",
                           "message_type": "outgoing", "content_attributes": {"external_error": "131026: Message undeliverable"},
                           "conversation": {"id": stack.status("storm").conversation_id}}).encode()
        barrier = threading.Barrier(20)
        answers: list[int] = []

        def post(copies: range) -> None:
            with httpx.Client(timeout=10) as client:
                barrier.wait()
                for copy in copies:
                    timestamp = str(int(time.time()))
                    signature = hmac.new(stack.secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
                    response = client.post(stack.receiver_url, content=body, headers={
                        "Content-Type": "application/json", "X-Service-Delivery": f"storm-{copy}",
                        "X-Service-Timestamp": timestamp, "X-Service-Signature": f"sha256={signature}"})
                    answers.append(response.status_code)

        threads = [threading.Thread(target=post, args=(range(n * 5, n * 5 + 5),)) for n in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert Counter(answers) == {200: 100}
        wait_until(lambda: stack.status("storm").state == "delivered", timeout_s=60, what="the fallback delivered")
        time.sleep(1.0)
        record = stack.status("storm")
        assert record.fallback_decision == "fallback"
        assert [attempt.route for attempt in record.attempts] == ["reminders", "sms"]
        assert _sms_messages_for(sandbox, "storm") == 1
        consumer_logs = stack.group.logs()
        # the decision's own line is logged by the compare-and-set's winner only (whichever word its run ends with:
        # "fallback", or "owed_fallback" when a run that saw a copy decided first)
        assert consumer_logs.count("fallback decision fallback") == 1, "exactly one consumer run made the decision"


def test_with_every_webhook_dropped_reconciliation_finds_the_truth(stack_factory: Any) -> None:
    with running_sandbox(NO_WEBHOOKS) as sandbox:
        stack = stack_factory(sandbox, consumers=1, DISPATCHER_RECONCILE_AFTER_S="1")
        stack.dispatcher.notify(reminder("quiet-ok", identifier="t-q1", phone="+15550501101"))
        stack.dispatcher.notify(reminder("quiet-fail", identifier="t-q2", phone="+15550107301"))

        def settled() -> bool:
            return stack.status("quiet-ok").state == "read" and stack.status("quiet-fail").state == "delivered"

        wait_until(settled, timeout_s=90, what="reconciliation to find every true state")
        assert sandbox.stats()["webhooks"].get("dropped", 0) > 0
        assert stack.status("quiet-fail").fallback_decision == "fallback"
        assert stack.status("quiet-fail").attempts[0].state == "failed"
        assert _sms_messages_for(sandbox, "quiet-fail") == 1


def test_at_the_default_settings_a_lost_webhook_is_settled_within_minutes(stack_factory: Any) -> None:
    # Given the shipped reconciliation settings (first read a minute after the last news) and a
    # workspace whose every webhook is lost (a stock workspace never retries one)
    with running_sandbox(NO_WEBHOOKS) as sandbox:
        stack = stack_factory(sandbox, consumers=1)
        stack.dispatcher.notify(reminder("default-quiet", identifier="t-q3", phone="+15550501103"))
        wait_until(lambda: stack.status("default-quiet").message_id is not None, timeout_s=30, what="the send")
        # Then reading the message list brings it to its true state, read, without any webhook
        wait_until(lambda: stack.status("default-quiet").state == "read", timeout_s=150,
                   what="reconciliation at the default settings")
        assert sandbox.stats()["webhooks"].get("delivered", 0) == 0


READ_WAIT: dict[str, str] = {}  # the shipped status_read_wait_s; tests/chaos measures it under fire too


def test_tracking_a_stock_workspace_costs_at_most_one_status_read_per_message(stack_factory: Any) -> None:
    # Given a stock workspace at its default timings (no status at the top of its webhooks) and
    # forty-one reminders to ten patients, four or five each
    with running_sandbox() as sandbox:
        stack = stack_factory(sandbox, consumers=2, **READ_WAIT)
        events = [f"reads-{n}" for n in range(41)]
        for n, event in enumerate(events):
            stack.dispatcher.notify(reminder(event, identifier=f"reads-p{n % 10}", phone=f"+1555050{n % 10:04d}"))
        # When every one has been delivered and read
        wait_until(lambda: all(stack.status(event).state == "read" for event in events), timeout_s=120,
                   what="every reminder read")
        time.sleep(3.0)  # a read coalesced after the last webhooks would come within status_read_wait_s
        stats = sandbox.stats()
    # Then the message lists were read at most once per message (three webhooks came for each: the
    # provider's id, delivered, read; most carry their message's own status, the others cost a read)
    reads = stats["calls"].get("listMessages", 0)
    print(f"\n[reads] {reads} listMessages calls for {len(events)} messages: {reads / len(events):.2f} a message")
    assert stats["webhooks"]["delivered"] >= 3 * len(events)
    assert reads <= len(events)


def _signed_headers(stack: Stack, body: bytes, delivery_id: str) -> dict[str, str]:
    timestamp = str(int(time.time()))
    signature = hmac.new(stack.secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-Chatwoot-Delivery": delivery_id,
            "X-Chatwoot-Timestamp": timestamp, "X-Chatwoot-Signature": f"sha256={signature}"}


@pytest.mark.parametrize(("late_sent_s", "backlog"), [(0.3, 0), (0.05, 0), (0.05, 1000)],
                         ids=["0.3s-live", "0.05s-live", "0.05s-behind-1000"])
def test_reminders_the_workspace_calls_sent_after_delivering_them_never_fall_back(
    stack_factory: Any, late_sent_s: float, backlog: int
) -> None:
    """The field's out-of-order status, for recipients who never read: delivered, then a late
    "sent" overwrites it in the workspace. Live, the consumer races the late "sent" (0.3 s and
    50 ms after delivered); behind a backlog of 1,000 deliveries every read of theirs comes long
    after it. Either way they must end delivered, and no SMS goes out."""
    with running_sandbox(f"[behaviour]\nlate_sent_after_s = {late_sent_s}\n") as sandbox:
        # behind a backlog, the consumer starts only once the backlog and the late "sent"s are in
        stack = stack_factory(sandbox, consumers=0 if backlog else 1)
        # given a backlog of verified deliveries waiting for the consumer (or none: live)
        with httpx.Client(timeout=10) as client:
            for n in range(backlog):
                body = json.dumps({"event": "message_updated", "id": 900_000_000 + n, "message_type": "outgoing",
                                   "content_attributes": {}, "conversation": {"id": 1}}).encode()
                assert client.post(stack.receiver_url, content=body,
                                   headers=_signed_headers(stack, body, f"backlog-{n}")).status_code == 200
        # and two reminders each to three patients who never read (the stock seed's +1555071...): the
        # first of each pair is not its conversation's latest, so its webhooks carry no status of its own
        events = [f"late-{patient}-{n}" for patient in range(3) for n in range(2)]
        for event in events:
            patient = event.split("-")[1]
            stack.dispatcher.notify(reminder(event, identifier=f"late-p{patient}", phone=f"+155507100{patient}0"))
        wait_until(lambda: all(stack.status(event).message_id is not None for event in events), timeout_s=60,
                   what="every reminder sent")
        ours = {stack.status(event).message_id for event in events}

        def overwritten() -> bool:
            rows = [m for m in sandbox.messages() if m["id"] in ours]
            return len(rows) == len(ours) and all((m["status"], m["highest_status"]) == ("sent", "delivered")
                                                  for m in rows)
        wait_until(overwritten, timeout_s=30, what="the late sent after each delivery")
        if backlog:
            # when the consumer starts, and works through the backlog first
            stack.group.start_worker("consumer0", concurrency=2, queues="dispatcher.outcomes")
        wait_until(lambda: all(stack.status(event).state == "delivered" for event in events), timeout_s=180,
                   what="every reminder recorded delivered")
        # then none fell back, and no SMS went out
        assert [stack.status(event).fallback_decision for event in events] == [None] * len(events)
        assert sum(_sms_messages_for(sandbox, event) for event in events) == 0
        words = Counter(row.outcome for row in _delivery_rows(stack) if row.message_id in ours)
        print(f"\n[late sent {late_sent_s}, backlog {backlog}] outcome words of their deliveries: {dict(words)}")


def _delivery_rows(stack: Stack) -> list[Any]:
    engine = stack.dispatcher.sessions.kw["bind"]
    with engine.connect() as connection:
        return list(connection.execute(sa.text("SELECT message_id, outcome FROM webhook_deliveries")))


SLOW_READ = """
[behaviour]
delivered_after_s = 0.2
read_after_s = 6.0
"""


def test_a_report_that_came_while_the_store_was_away_is_applied_within_seconds_of_its_return(
    stack_factory: Any, fresh_postgres_url: str
) -> None:
    """A stock workspace never sends a refused report again. The receiver, refusing it because its
    store is away, hands the delivery itself to the consumer, which records and applies it within
    seconds of the store's return, not at the next scheduled read-back (a minute after the news)."""
    direct = sa.engine.make_url(fresh_postgres_url)
    with tcp_proxy(direct.host or "127.0.0.1", direct.port or 5432) as proxy, running_sandbox(SLOW_READ) as sandbox:
        through_proxy = direct.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        stack = stack_factory(sandbox, consumers=1, database_url=through_proxy)
        assert stack.dispatcher.settings.reconcile_after_s >= 60  # the scheduled read-back is far off
        stack.dispatcher.notify(reminder("away-1", identifier="t-away", phone="+15550501101"))
        wait_until(lambda: stack.status("away-1").state == "delivered", timeout_s=30, what="delivered")
        message_id = stack.status("away-1").message_id

        proxy.cut()  # the store goes away; the read report arrives meanwhile and is refused
        wait_until(lambda: any(m["id"] == message_id and m["status"] == "read" for m in sandbox.messages()),
                   timeout_s=30, what="the read in the workspace")
        wait_until(lambda: "store_unavailable" in stack.group.logs() or "not recorded" in stack.group.logs(),
                   timeout_s=15, what="the receiver refusing the report")
        assert stack.status("away-1").state == "delivered"
        proxy.restore()

        wait_until(lambda: stack.status("away-1").state == "read", timeout_s=30, what="read, from the handed-over report")
        assert "dispatcher.record_delivery" in stack.group.logs()


def test_reports_of_an_overwritten_delivery_that_came_while_the_store_was_away_still_prevent_a_fallback(
    stack_factory: Any, fresh_postgres_url: str
) -> None:
    """Delivered, then a late "sent" overwrites it, while the store is away: a read-back after the
    store's return would find "sent" and the deadline would fall back. The reports themselves,
    handed over by the receiver, say it moved past sent."""
    direct = sa.engine.make_url(fresh_postgres_url)
    with tcp_proxy(direct.host or "127.0.0.1", direct.port or 5432) as proxy, running_sandbox() as sandbox:
        through_proxy = direct.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        stack = stack_factory(sandbox, consumers=1, database_url=through_proxy)
        stack.dispatcher.notify(reminder("away-late", identifier="t-away-late", phone="+15550710101"))
        wait_until(lambda: stack.status("away-late").message_id is not None, timeout_s=30, what="the send")
        message_id = stack.status("away-late").message_id
        proxy.cut()  # before its delivery is reported (delivered 0.5 s after the send, the late sent 0.75 s later)
        wait_until(lambda: any(m["id"] == message_id and (m["status"], m["highest_status"]) == ("sent", "delivered")
                               for m in sandbox.messages()), timeout_s=30, what="the late sent in the workspace")
        wait_until(lambda: "not recorded" in stack.group.logs(), timeout_s=15, what="the receiver refusing reports")
        proxy.restore()
        wait_until(lambda: stack.status("away-late").state == "delivered", timeout_s=60,
                   what="delivered, from the handed-over reports")
        assert stack.status("away-late").fallback_decision is None
        assert _sms_messages_for(sandbox, "away-late") == 0


def test_while_no_consumer_runs_each_unprocessed_delivery_keeps_one_task_in_the_queue(stack_factory: Any) -> None:
    """Issue 47: with the consumers stopped, the tracking sweep used to publish every unprocessed
    delivery again once it was DELIVERY_GRACE_S (30 s) old, and again each 30 s after, while its
    first task still waited in the queue (100 deliveries, 262 queued tasks after a minute). The
    real receiver, beat and a send worker (which runs the sweep, every second here) with no consumer;
    the sweep's grace is the deployed one."""
    with running_sandbox(BEHAVIOUR) as sandbox:
        stack = stack_factory(sandbox, consumers=0)
        enqueuer = CeleryEnqueuer(stack.group.env["DISPATCHER_BROKER_URL"])
        try:
            with httpx.Client(timeout=10) as client:
                for number in range(100):
                    body = json.dumps({"event": "message_updated", "id": 900000 + number, "status": "delivered",
                                       "message_type": "outgoing", "conversation": {"id": 1}}).encode()
                    assert _post_signed(client, stack, body, f"waiting-{number}") == 200
            posted_at = time.monotonic()
            assert enqueuer.outcome_queue_depth() == 100
            # past the grace, five more sweeps: each would have published all 100 again under the old rule
            wait_until(lambda: time.monotonic() - posted_at > DELIVERY_GRACE_S + 1, timeout_s=DELIVERY_GRACE_S + 10,
                       what="the deliveries past the sweep's grace")
            past_grace = _sweeps_finished(stack)
            wait_until(lambda: _sweeps_finished(stack) >= past_grace + 5, timeout_s=60, what="five sweeps past the grace")
            assert enqueuer.outcome_queue_depth() == 100
            with stack.dispatcher.sessions() as session:
                republished = session.execute(sa.text(
                    "SELECT count(*) FROM webhook_deliveries WHERE republished_at IS NOT NULL")).scalar_one()
            assert republished == 0
            # and a consumer started now applies each once and empties the queue
            stack.group.start_worker("consumer0", concurrency=2, queues="dispatcher.outcomes")
            wait_until(lambda: enqueuer.outcome_queue_depth() == 0 and _unprocessed(stack) == 0, timeout_s=60,
                       what="every delivery processed")
        finally:
            enqueuer.close()


def _sweeps_finished(stack: Stack) -> int:
    """The tracking sweeps the send worker has finished (Celery's INFO line of each task's end)."""
    return len(re.findall(rf"Task {re.escape(TRACKING_SWEEP_TASK)}\[[^\]]+\] succeeded", stack.group.logs()))


def _unprocessed(stack: Stack) -> int:
    with stack.dispatcher.sessions() as session:
        return int(session.execute(sa.text("SELECT count(*) FROM webhook_deliveries WHERE processed_at IS NULL")).scalar_one())


def _post_signed(client: httpx.Client, stack: Stack, body: bytes, delivery_id: str) -> int:
    timestamp = str(int(time.time()))
    signature = hmac.new(stack.secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return client.post(stack.receiver_url, content=body, headers={
        "Content-Type": "application/json", "X-Service-Delivery": delivery_id,
        "X-Service-Timestamp": timestamp, "X-Service-Signature": f"sha256={signature}"}).status_code
