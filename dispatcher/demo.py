"""The embedded demo, as far as the product exists today.

The send path with its workers, the webhook receiver and the fallback (the later issues) are not
built yet. Until they are, the demo shows the foundation end to end: it starts the sandbox as a
child process, reads the example configuration, and walks the contract's send steps with the
workspace client for a few sample contacts (find or create the contact, its source_id, one
conversation, one message), then watches the sandbox until every message reaches its final state.

It prints contact identifiers, never phone numbers or message content.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from dispatcher.api import WorkspaceClient, find_contact_exact
from dispatcher.errors import ConfigurationError, DispatcherError
from dispatcher.routes import find_route_inbox
from dispatcher.settings import Settings, load_settings

EXAMPLE_CONFIG = Path(__file__).resolve().parents[1] / "config" / "dispatcher.example.toml"
SETTLE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Sample:
    """One demo notification and the final state the sandbox should reach for it."""

    identifier: str
    name: str
    phone_number: str
    template: str
    params: dict[str, str]
    expected_status: str
    expected_error: str | None = None


SAMPLES = (
    Sample("patient-1001", "Ana", "+15550301001", "appointment_reminder", {"1": "Ana", "2": "Mon 09:00"}, "read"),
    Sample("patient-1002", "Ben", "+15550301002", "appointment_reminder", {"1": "Ben", "2": "Tue 10:30"}, "read"),
    Sample("patient-1003", "Cleo", "+15550301003", "test_results_ready", {"1": "Cleo"}, "read"),
    # The sandbox's seed makes numbers starting +1555010 undeliverable on the platform.
    Sample("patient-1004", "Dan", "+15550107004", "appointment_reminder", {"1": "Dan", "2": "Wed"}, "failed", "131026"),
    # One parameter short of the approved template: the platform refuses it.
    Sample("patient-1005", "Eve", "+15550301005", "appointment_reminder", {"1": "Eve"}, "failed", "132000"),
)


@dataclass
class Outcome:
    sample: Sample
    message_id: int | None = None
    conversation_id: int | None = None
    status: str | None = None
    error_code: str | None = None

    @property
    def as_expected(self) -> bool:
        return self.status == self.sample.expected_status and self.error_code == self.sample.expected_error


def run_demo(out: IO[str]) -> int:
    """Run the demo; return the exit status (0 when every state is the expected one)."""
    with tempfile.TemporaryDirectory(prefix="dispatcher-demo-") as workdir, _sandbox(Path(workdir), out) as base_url:
        settings = _demo_settings(base_url)
        outcomes = _send_samples(settings, out)
        _wait_for_final_states(base_url, outcomes, out)
    _print_table(outcomes, out)
    failures = [outcome for outcome in outcomes if not outcome.as_expected]
    out.write("\nall states as expected\n" if not failures else f"\n{len(failures)} state(s) not as expected\n")
    return 0 if not failures else 1


def _demo_settings(base_url: str) -> Settings:
    if not EXAMPLE_CONFIG.is_file():
        raise ConfigurationError("DISPATCHER_CONFIG", f"the demo needs {EXAMPLE_CONFIG} (run it from a checkout)")
    values: dict[str, Any] = tomllib.loads(EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    values["api_url"] = base_url
    return load_settings(**values)


def _send_samples(settings: Settings, out: IO[str]) -> list[Outcome]:
    """The contract's steps 1-6 for each sample, one after the other."""
    route = settings.routes["reminders"]
    outcomes = []
    with WorkspaceClient.from_settings(settings) as client:
        inbox = find_route_inbox(route, client.list_inboxes())
        if inbox is None:
            raise ConfigurationError("routes.reminders.inbox_name", "no such inbox in the sandbox")
        for sample in SAMPLES:
            outcome = Outcome(sample)
            try:
                contact = find_contact_exact(client, identifier=sample.identifier, phone_number=sample.phone_number)
                if contact is None:
                    created = client.create_contact(
                        inbox_id=inbox.id, name=sample.name, identifier=sample.identifier, phone_number=sample.phone_number
                    )
                    contact_id, source_id = created.contact.id, created.source_id
                else:
                    contact_id = contact.id
                    source_id = next(
                        entry.source_id for entry in client.list_contactable_inboxes(contact.id) if entry.inbox and entry.inbox.id == inbox.id
                    )
                conversation = client.create_conversation(source_id=source_id, inbox_id=inbox.id, contact_id=contact_id)
                template = settings.template(sample.template, "en")
                assert template is not None, sample.template
                message = client.create_message(
                    conversation.id,
                    content=f"{sample.template} for {sample.name}",
                    template_params={
                        "name": template.name,
                        "category": template.category,
                        "language": template.language,
                        "processed_params": {"body": sample.params},
                    },
                )
                outcome.message_id, outcome.conversation_id = message.id, conversation.id
                out.write(f"accepted {sample.identifier}: message {message.id} in conversation {conversation.id}\n")
            except DispatcherError as error:
                outcome.status = "error"
                out.write(f"refused {sample.identifier}: {error}\n")
            outcomes.append(outcome)
    return outcomes


def _wait_for_final_states(base_url: str, outcomes: list[Outcome], out: IO[str]) -> None:
    """Poll the sandbox's own record until every accepted message is read or failed."""
    pending = {outcome.message_id: outcome for outcome in outcomes if outcome.message_id is not None}
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    out.write("waiting for delivery states")
    while True:
        messages = httpx.get(f"{base_url}/_sandbox/messages", timeout=5).json()
        for message in messages.get("messages", messages) if isinstance(messages, dict) else messages:
            outcome = pending.get(message.get("id"))
            if outcome is not None:
                outcome.status = message.get("status")
                error = message.get("external_error") or ""
                outcome.error_code = error.split(":")[0] or None
        if all(outcome.status in ("read", "failed") for outcome in pending.values()):
            break
        if time.monotonic() > deadline:
            break
        out.write(".")
        out.flush()
        time.sleep(0.5)
    out.write("\n")


def _print_table(outcomes: list[Outcome], out: IO[str]) -> None:
    header = ("contact", "template", "message", "conversation", "state", "error", "expected")
    rows = [
        (
            outcome.sample.identifier,
            outcome.sample.template,
            str(outcome.message_id or "-"),
            str(outcome.conversation_id or "-"),
            outcome.status or "-",
            outcome.error_code or "-",
            "yes" if outcome.as_expected else "NO",
        )
        for outcome in outcomes
    ]
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    out.write("\n")
    for row in (header, *rows):
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() + "\n")


@contextlib.contextmanager
def _sandbox(workdir: Path, out: IO[str]) -> Iterator[str]:
    """The sandbox as a child process on a free loopback port; stopped on the way out."""
    port = _free_port()
    log_path = workdir / "sandbox.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        out.write(f"sandbox starting on {base_url}\n")
        _wait_until_healthy(base_url, process, log_path)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_healthy(base_url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the sandbox exited at start-up:\n{log_path.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base_url}/_sandbox/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("the sandbox did not answer within 20 s")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
