"""``dispatcher demo``: the whole product on embedded defaults, with no server installed.

It starts, as child processes, the sandbox, a send worker, the webhook receiver, the outcome
consumer and beat, over a SQLite store and the filesystem broker in a scratch folder; registers
the receiver's webhook; hands over sample notifications (reminders, one recipient the platform
cannot reach and who falls back to SMS, one template the platform never approved, one event
handed over twice); shows progress; prints a table of the final states; stops every child; and
exits 0 only when every state is the expected one.

It prints event IDs and states, never phone numbers or message content.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from dispatcher.api import WorkspaceClient
from dispatcher.demo.children import Children, children, free_port, wait_for_http
from dispatcher.demo.scenario import DUPLICATE_OF, SAMPLES, UNAPPROVED_TEMPLATE, Sample
from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.errors import ConfigurationError
from dispatcher.migrate import upgrade_database
from dispatcher.record import NotificationRecord
from dispatcher.service import Dispatcher
from dispatcher.settings import Settings, load_settings

EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "config" / "dispatcher.example.toml"
SETTLE_TIMEOUT_S = 90.0
SANDBOX_CONFIG = """
[behaviour]
delivered_after_s = 0.3
read_after_s = 0.5
failed_after_s = 0.2
"""

__all__ = ["run_demo"]


def run_demo(out: IO[str]) -> int:
    """Run the demo; return the exit status (0 when every final state is the expected one)."""
    if not EXAMPLE_CONFIG.is_file():
        raise ConfigurationError("DISPATCHER_CONFIG", f"the demo needs {EXAMPLE_CONFIG} (run it from a checkout)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dispatcher-demo-") as scratch:
        workdir = Path(scratch)
        env = _environment(workdir)
        with children(env, workdir) as group:
            settings = _start(group, workdir, env, out)
            records = _hand_over(settings, out)
            _wait_until_settled(settings, group, out)
            records = {sample.event_id: Dispatcher(settings, enqueuer=_NoEnqueue()).status(sample.event_id) for sample in SAMPLES}
        out.write("stopped every child process\n")
    failures = _print_table(records, out)
    out.write(f"\n{'all states as expected' if not failures else f'{failures} state(s) not as expected'}"
              f" ({time.monotonic() - started:.0f} s)\n")
    return 0 if not failures else 1


def _environment(workdir: Path) -> dict[str, str]:
    """Every child's settings: the example configuration, a scratch store and broker, quick sweeps."""
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


def _start(group: Children, workdir: Path, env: dict[str, str], out: IO[str]) -> Settings:
    sandbox_port, receiver_port = free_port(), free_port()
    (workdir / "sandbox.toml").write_text(SANDBOX_CONFIG)
    env["DISPATCHER_API_URL"] = f"http://127.0.0.1:{sandbox_port}"
    out.write(f"starting the sandbox on 127.0.0.1:{sandbox_port}\n")
    group.start("sandbox", "sandbox", "--host", "127.0.0.1", "--port", str(sandbox_port), "--config", str(workdir / "sandbox.toml"))
    upgrade_database(env["DISPATCHER_DATABASE_URL"])
    wait_for_http(f"{env['DISPATCHER_API_URL']}/_sandbox/health", group)
    settings = _settings(env)
    webhook_url = f"http://127.0.0.1:{receiver_port}{settings.webhook_path}"
    with WorkspaceClient.from_settings(settings) as client:
        webhook = client.create_webhook(url=webhook_url, subscriptions=["message_created", "message_updated"], name="demo")
    assert webhook.secret is not None, "createWebhook returned no secret"
    env["DISPATCHER_WEBHOOK_SECRETS"] = webhook.secret.get_secret_value()  # to the receiver only, never printed
    out.write("registered the webhook; starting the receiver, a worker, the consumer and beat\n")
    group.start("receiver", "dispatcher", "receiver", "--host", "127.0.0.1", "--port", str(receiver_port))
    celery = ("celery", "-A", "workers.app")
    group.start("worker", *celery, "worker", "--queues", "dispatcher.send,dispatcher.maintenance", "--concurrency", "2",
                "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--hostname", "demo-worker@%h")
    group.start("consumer", *celery, "worker", "--queues", "dispatcher.outcomes", "--concurrency", "1",
                "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--hostname", "demo-consumer@%h")
    group.start("beat", *celery, "beat", "--loglevel", "WARNING", "--schedule", str(workdir / "beat-schedule"))
    wait_for_http(f"http://127.0.0.1:{receiver_port}/healthz", group)
    return settings


def _settings(env: dict[str, str]) -> Settings:
    overrides = {key.removeprefix("DISPATCHER_").lower(): value for key, value in env.items()
                 if key.startswith("DISPATCHER_") and key != "DISPATCHER_CONFIG"}
    os.environ["DISPATCHER_CONFIG"] = env["DISPATCHER_CONFIG"]
    overrides["templates"] = json.loads(overrides["templates"])
    return load_settings(**overrides)


def _hand_over(settings: Settings, out: IO[str]) -> dict[str, NotificationRecord]:
    dispatcher = Dispatcher(settings, enqueuer=CeleryEnqueuer(settings.broker_url))
    records = {}
    for sample in SAMPLES:
        records[sample.event_id] = dispatcher.notify(sample.request)
        out.write(f"handed over {sample.event_id} ({sample.what}): {records[sample.event_id].state}\n")
    duplicate = next(sample for sample in SAMPLES if sample.event_id == DUPLICATE_OF)
    again = dispatcher.notify(duplicate.request)
    same = "the same notification" if again.created_at == records[DUPLICATE_OF].created_at else "A NEW ONE"
    out.write(f"handed over {DUPLICATE_OF} again (duplicate event): {same}\n")
    return records


def _settled(sample: Sample, record: NotificationRecord) -> bool:
    if record.state in ("read", "failed"):
        return True
    return record.state == "delivered" and sample.expected_state == "delivered"


def _wait_until_settled(settings: Settings, group: Children, out: IO[str]) -> None:
    dispatcher = Dispatcher(settings, enqueuer=_NoEnqueue())
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        group.check_alive()
        records = [dispatcher.status(sample.event_id) for sample in SAMPLES]
        counts: dict[str, int] = {}
        for record in records:
            counts[record.state] = counts.get(record.state, 0) + 1
        line = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
        if line != last:
            out.write(f"  {time.strftime('%H:%M:%S')}  {line}\n")
            out.flush()
            last = line
        if all(_settled(sample, record) for sample, record in zip(SAMPLES, records, strict=True)):
            return
        time.sleep(0.5)
    out.write(f"  gave up waiting after {SETTLE_TIMEOUT_S:.0f} s\n")


def _print_table(records: dict[str, NotificationRecord], out: IO[str]) -> int:
    header = ("event", "what", "route", "channel", "message", "conversation", "state", "fallback", "expected")
    rows, failures = [], 0
    for sample in SAMPLES:
        record = records[sample.event_id]
        ok = (record.state == sample.expected_state and record.channel == sample.expected_channel
              and record.fallback_decision == sample.expected_fallback)
        failures += not ok
        rows.append((
            sample.event_id, sample.what, record.route + (f" -> {record.fallback_route}" if record.fallback_decision == "fallback" else ""),
            record.channel or "-", str(record.message_id or "-"), str(record.conversation_id or "-"), record.state,
            f"{record.fallback_decision}: {record.fallback_reason}" if record.fallback_decision else "-",
            "yes" if ok else f"NO (want {sample.expected_state})",
        ))
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    out.write("\n")
    for row in (header, *rows):
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n")
    return failures


class _NoEnqueue:
    def enqueue_send(self, notification_ids: Any) -> list[int]:
        return []


def main() -> None:  # python -m dispatcher.demo
    sys.exit(run_demo(sys.stdout))
