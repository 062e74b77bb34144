"""``dispatcher demo``: the whole product on embedded defaults, with no server installed.

It starts, as child processes, the sandbox (stock profile, as a real workspace behaves), a send
worker, the webhook receiver, the outcome consumer and beat, over a SQLite store and the
filesystem broker in ``var/demo/``; registers the receiver's webhook once; hands over sample
notifications (reminders, one recipient the platform cannot reach and who falls back to SMS, one
template the platform never approved, one event handed over twice, and a patient who writes back,
so that the follow-up goes out as free text inside the 24-hour window); shows progress; prints a
table of the final states; stops every child; and exits 0 only when every state is the expected one.

Everything it keeps stays in ``var/demo/``, the sandbox's data included, as a real workspace keeps
its own: a second run sends the same reminders again (under new event IDs, to the same patients,
reusing their contacts and conversations) and must end the same way. Delete the folder to start over.

It shortens the sweeps' timers (see ``_environment``) so that the demo ends within a minute; the
shipped defaults are in config/dispatcher.example.toml. It prints event IDs and states, never phone
numbers or message content.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

from dispatcher.api import Rejected, WorkspaceClient
from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.errors import ConfigurationError
from dispatcher.operations.demo.children import Children, children, free_port, port_is_free, wait_for_http
from dispatcher.operations.demo.memory import DemoMemory
from dispatcher.operations.demo.scenario import DUPLICATE_OF, SAMPLES, UNAPPROVED_TEMPLATE, Sample, reply_samples
from dispatcher.policy.channels import window_open
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings, load_settings
from dispatcher.store import queries as store
from dispatcher.store.db import session_factory, shared_engine
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import utcnow
from dispatcher.store.record import NotificationRecord

EXAMPLE_CONFIG = Path(__file__).resolve().parents[3] / "config" / "dispatcher.example.toml"
DEMO_DIR = Path("var") / "demo"
SETTLE_TIMEOUT_S = 90.0
REPLY = "Can I come at 12:30 instead?"
SANDBOX_CONFIG = """
[behaviour]
delivered_after_s = 0.3
read_after_s = 0.5
failed_after_s = 0.2
"""

__all__ = ["run_demo"]


def run_demo(out: IO[str], workdir: Path | None = None) -> int:
    """Run the demo in ``workdir`` (default ``var/demo``); return the exit status (0 when every
    final state is the expected one)."""
    if not EXAMPLE_CONFIG.is_file():
        raise ConfigurationError("DISPATCHER_CONFIG", f"the demo needs {EXAMPLE_CONFIG} (run it from a checkout)")
    started = time.monotonic()
    workdir = (workdir or DEMO_DIR).resolve()
    (workdir / "logs").mkdir(mode=0o700, parents=True, exist_ok=True)  # the banner in the logs names tokens
    memory = DemoMemory.load(workdir)
    memory.runs += 1
    memory.save()
    samples = [sample.for_run(memory.runs) for sample in SAMPLES]
    replied, follow_up = reply_samples(memory.runs)
    out.write(f"demo run {memory.runs} in {workdir} (delete the folder to start over)\n")
    env = _environment(workdir)
    with children(env, workdir / "logs") as group:
        settings = _start(group, workdir, env, out, memory)
        duplicate = next(sample for sample in samples if sample.event_id.startswith(DUPLICATE_OF))
        _hand_over(settings, [*samples, replied], out, duplicate=duplicate)
        _wait_until_settled(settings, group, [*samples, replied], out)
        _customer_replies(settings, group, replied, out)
        _hand_over(settings, [follow_up], out)
        _wait_until_settled(settings, group, [follow_up], out)
        everything = [*samples, replied, follow_up]
        dispatcher = Dispatcher(settings, enqueuer=_NoEnqueue())
        records = {sample.event_id: dispatcher.status(sample.event_id) for sample in everything}
        kinds = _kinds_sent(settings)
    out.write("stopped every child process\n")
    failures = _print_table(everything, records, kinds, out)
    out.write(f"\n{'all states as expected' if not failures else f'{failures} state(s) not as expected'}"
              f" ({time.monotonic() - started:.0f} s)\n")
    return 0 if not failures else 1


def _environment(workdir: Path) -> dict[str, str]:
    """Every child's settings: the example configuration, the demo's own store and broker, and
    sweeps and retries shortened so that the demo ends within a minute (a demo, not a proof: the
    tests and benchmarks run at the example configuration's values)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("DISPATCHER_")}
    settings = load_settings_from_file()
    templates = [template.model_dump() for template in settings.templates] + [UNAPPROVED_TEMPLATE]
    env.update(
        DISPATCHER_CONFIG=str(EXAMPLE_CONFIG),
        DISPATCHER_DATABASE_URL=f"sqlite:///{workdir}/dispatcher.sqlite",
        DISPATCHER_BROKER_URL=f"filesystem://{workdir}/broker",
        DISPATCHER_TEMPLATES=json.dumps(templates),
        DISPATCHER_SWEEP_INTERVAL_S="1",
        DISPATCHER_RECONCILE_AFTER_S="10",
        DISPATCHER_STALE_AFTER_S="20",
        DISPATCHER_RETRY_BASE_S="0.5",
        DISPATCHER_RETRY_CAP_S="4",
        PYTHONUNBUFFERED="1",
    )
    return env


def load_settings_from_file() -> Settings:
    previous = os.environ.get("DISPATCHER_CONFIG")
    os.environ["DISPATCHER_CONFIG"] = str(EXAMPLE_CONFIG)
    try:
        return load_settings(api_url="http://127.0.0.1:1")
    finally:
        if previous is None:
            os.environ.pop("DISPATCHER_CONFIG")
        else:
            os.environ["DISPATCHER_CONFIG"] = previous


def _start(group: Children, workdir: Path, env: dict[str, str], out: IO[str], memory: DemoMemory) -> Settings:
    sandbox_port = free_port()
    (workdir / "sandbox.toml").write_text(SANDBOX_CONFIG)
    env["DISPATCHER_API_URL"] = f"http://127.0.0.1:{sandbox_port}"
    out.write(f"starting the sandbox on 127.0.0.1:{sandbox_port} (its data: {workdir / 'sandbox-state.jsonl'})\n")
    group.start("sandbox", "sandbox", "--host", "127.0.0.1", "--port", str(sandbox_port),
                "--config", str(workdir / "sandbox.toml"), "--state", str(workdir / "sandbox-state.jsonl"))
    upgrade_database(env["DISPATCHER_DATABASE_URL"])
    wait_for_http(f"{env['DISPATCHER_API_URL']}/_sandbox/health", group)
    settings = _settings(env)
    receiver_port, secret = _webhook(settings, memory, out)
    env["DISPATCHER_WEBHOOK_SECRETS"] = secret  # to the receiver only, never printed
    out.write("starting the receiver, a worker, the consumer and beat\n")
    group.start("receiver", "dispatcher", "receiver", "--host", "127.0.0.1", "--port", str(receiver_port))
    celery = ("celery", "-A", "workers.app")
    group.start("worker", *celery, "worker", "--queues", "dispatcher.send,dispatcher.maintenance", "--concurrency", "2",
                "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--hostname", "demo-worker@%h")
    group.start("consumer", *celery, "worker", "--queues", "dispatcher.outcomes", "--concurrency", "1",
                "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--hostname", "demo-consumer@%h")
    group.start("beat", *celery, "beat", "--loglevel", "WARNING", "--schedule", str(workdir / "beat-schedule"))
    wait_for_http(f"http://127.0.0.1:{receiver_port}/healthz", group)
    return settings


def _webhook(settings: Settings, memory: DemoMemory, out: IO[str]) -> tuple[int, str]:
    """The receiver's port and its webhook's secret: registered once, reused by later runs.

    A workspace shows a webhook's secret only when it makes it, and a stock one keeps one webhook
    per URL, so the demo keeps the port and the secret in its memory file, as an operator keeps a
    secret in a secret store. When the remembered port is taken (or the memory is gone while the
    workspace still has the URL), it registers a new port.
    """
    remembered = memory.receiver_port
    with WorkspaceClient.from_settings(settings) as client:
        if remembered is not None and memory.webhook_secret and port_is_free(remembered):
            url = f"http://127.0.0.1:{remembered}{settings.webhook_path}"
            if url in {hook.url for hook in client.list_webhooks()}:
                out.write("the receiver's webhook is registered from an earlier run\n")
                return remembered, memory.webhook_secret
        for _ in range(3):
            port = free_port()
            url = f"http://127.0.0.1:{port}{settings.webhook_path}"
            try:
                webhook = client.create_webhook(url=url, subscriptions=["message_created", "message_updated"], name="demo")
            except Rejected:
                continue  # the workspace has this URL from a run whose secret is lost: another port
            assert webhook.secret is not None, "createWebhook returned no secret"
            memory.receiver_port, memory.webhook_secret = port, webhook.secret.get_secret_value()
            memory.save()
            out.write("registered the receiver's webhook\n")
            return port, memory.webhook_secret
    raise RuntimeError("the workspace refused three webhook URLs in a row")


def _settings(env: dict[str, str]) -> Settings:
    overrides = {key.removeprefix("DISPATCHER_").lower(): value for key, value in env.items()
                 if key.startswith("DISPATCHER_") and key != "DISPATCHER_CONFIG"}
    os.environ["DISPATCHER_CONFIG"] = env["DISPATCHER_CONFIG"]
    overrides["templates"] = json.loads(overrides["templates"])
    return load_settings(**overrides)


def _hand_over(settings: Settings, samples: list[Sample], out: IO[str], *, duplicate: Sample | None = None) -> None:
    dispatcher = Dispatcher(settings, enqueuer=CeleryEnqueuer(settings.broker_url))
    records = {}
    for sample in samples:
        records[sample.event_id] = dispatcher.notify(sample.request)
        out.write(f"handed over {sample.event_id} ({sample.what}): {records[sample.event_id].state}\n")
    if duplicate is not None:
        again = dispatcher.notify(duplicate.request)
        same = "the same notification" if again.created_at == records[duplicate.event_id].created_at else "A NEW ONE"
        out.write(f"handed over {duplicate.event_id} again (duplicate event): {same}\n")


def _settled(sample: Sample, record: NotificationRecord) -> bool:
    if record.state in ("read", "failed"):
        return True
    return record.state == "delivered" and sample.expected_state == "delivered"


def _wait_until_settled(settings: Settings, group: Children, samples: list[Sample], out: IO[str]) -> None:
    dispatcher = Dispatcher(settings, enqueuer=_NoEnqueue())
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        group.check_alive()
        records = [dispatcher.status(sample.event_id) for sample in samples]
        counts: dict[str, int] = {}
        for record in records:
            counts[record.state] = counts.get(record.state, 0) + 1
        line = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
        if line != last:
            out.write(f"  {time.strftime('%H:%M:%S')}  {line}\n")
            out.flush()
            last = line
        if all(_settled(sample, record) for sample, record in zip(samples, records, strict=True)):
            return
        time.sleep(0.5)
    out.write(f"  gave up waiting after {SETTLE_TIMEOUT_S:.0f} s\n")


def _customer_replies(settings: Settings, group: Children, sample: Sample, out: IO[str]) -> None:
    """The patient writes back in the reminder's conversation (the sandbox plays the patient), and
    the demo waits until the consumer has applied it: the 24-hour window is then open."""
    record = Dispatcher(settings, enqueuer=_NoEnqueue()).status(sample.event_id)
    if record.conversation_id is None:
        out.write(f"  {sample.event_id} has no conversation: no reply\n")
        return
    answer = httpx.post(f"{settings.api_url}/_sandbox/incoming", timeout=10, trust_env=False,
                        json={"account_id": settings.account_id, "conversation_id": record.conversation_id, "content": REPLY})
    answer.raise_for_status()
    out.write(f"the patient of {sample.event_id} writes back; waiting for the consumer to open the 24-hour window\n")
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        group.check_alive()
        if window_is_open(settings, sample.event_id):
            out.write("  the window is open\n")
            return
        time.sleep(0.3)
    out.write(f"  the window did not open within {SETTLE_TIMEOUT_S:.0f} s\n")


def window_is_open(settings: Settings, event_id: str) -> bool:
    """Whether the dispatcher's store has the window open for the contact and inbox of ``event_id``."""
    with session_factory(shared_engine(settings.database_url))() as session:
        pair = store.first_attempt_pair(session, event_id)
        if pair is None:
            return False
        return window_open(store.last_incoming_at(session, account=settings.account, contact_id=pair[0],
                                                  inbox_id=pair[1]), now=utcnow())


def _kinds_sent(settings: Settings) -> dict[int, str]:
    """How the workspace got each message, from the sandbox's own record: template or free text."""
    answer = httpx.get(f"{settings.api_url}/_sandbox/messages", timeout=10, trust_env=False)
    answer.raise_for_status()
    return {row["id"]: "template" if row["template_name"] else "free text" for row in answer.json()["messages"]}


def _print_table(samples: list[Sample], records: dict[str, NotificationRecord], kinds: dict[int, str], out: IO[str]) -> int:
    header = ("event", "what", "route", "channel", "sent as", "message", "conversation", "state", "fallback", "expected")
    rows, failures = [], 0
    for sample in samples:
        record = records[sample.event_id]
        kind = kinds.get(record.message_id or 0, "-")
        ok = (record.state == sample.expected_state and record.channel == sample.expected_channel
              and record.fallback_decision == sample.expected_fallback and kind == sample.expected_kind)
        failures += not ok
        rows.append((
            sample.event_id, sample.what, record.route + (f" -> {record.fallback_route}" if record.fallback_decision == "fallback" else ""),
            record.channel or "-", kind, str(record.message_id or "-"), str(record.conversation_id or "-"), record.state,
            f"{record.fallback_decision}: {record.fallback_reason}" if record.fallback_decision else "-",
            "yes" if ok else f"NO (want {sample.expected_state}, {sample.expected_kind})",
        ))
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    out.write("\n")
    for row in (header, *rows):
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n")
    return failures


class _NoEnqueue:
    def enqueue_send(self, notification_ids: Any, *, queue: str = "") -> list[int]:
        return []


def main() -> None:  # python -m dispatcher.operations.demo
    sys.exit(run_demo(sys.stdout))
