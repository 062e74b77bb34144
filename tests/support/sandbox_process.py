"""Run the sandbox as a real process on a free loopback port, for tests and benchmarks.

Why a separate process: the sandbox stands in for a remote service, so tests talk to it over real
HTTP on 127.0.0.1 and share no memory with it (a client bug cannot be hidden by a shared object).

Use it as a context manager::

    with running_sandbox() as sb:                       # default seed shipped in the package
        httpx.get(f"{sb.api_url}/inboxes", headers=sb.headers)

    with running_sandbox('[behaviour]\\ndelivered_after_s = 0.05\\n') as sb: ...

or through the pytest fixtures at the bottom (import them in a conftest.py)::

    from tests.support.sandbox_process import sandbox, sandbox_session  # noqa: F401

Guarantees: startup waits at most ``startup_timeout_s`` (default 10 s) for ``GET /_sandbox/health``;
on exit the process is terminated (killed after 5 s) and, if it had died on its own, its stderr is
raised as a ``SandboxCrashed`` error so a crash never goes unnoticed.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ACCOUNT_ID = 1
DEFAULT_TOKEN = "sandbox-token-account-1"
OTHER_ACCOUNT_ID = 2
OTHER_TOKEN = "sandbox-token-account-2"
EVENT_IN_CONTENT = re.compile(r"^Reminder (\S+):")  # the content of tests.support.dispatcher_setup.reminder

__all__ = [
    "DEFAULT_ACCOUNT_ID",
    "DEFAULT_TOKEN",
    "OTHER_ACCOUNT_ID",
    "OTHER_TOKEN",
    "SandboxCrashed",
    "SandboxProcess",
    "contract_sandbox",
    "contract_sandbox_session",
    "free_port",
    "running_sandbox",
    "sandbox",
    "sandbox_session",
]


class SandboxCrashed(RuntimeError):
    """The sandbox process failed to start or exited on its own; the message holds its stderr tail."""


def free_port() -> int:
    """A loopback port that was free a moment ago (the caller retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SandboxProcess:
    """Handle on one running sandbox: its URLs, the seeded credentials and the inspection calls."""

    def __init__(self, *, proc: subprocess.Popen[bytes], port: int, stderr_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.host = "127.0.0.1"
        self.base_url = f"http://127.0.0.1:{port}"
        self.account_id = DEFAULT_ACCOUNT_ID
        self.token = DEFAULT_TOKEN
        self.stderr_path = stderr_path
        # trust_env=False: never route loopback traffic through a proxy from the environment.
        self.client = httpx.Client(base_url=self.base_url, timeout=10.0, trust_env=False)

    # -- contract helpers -------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        """Base URL of the contract paths for the default account (`.../api/v1/accounts/1`)."""
        return f"{self.base_url}/api/v1/accounts/{self.account_id}"

    @property
    def headers(self) -> dict[str, str]:
        """Request headers carrying the default account's token."""
        return {"api_access_token": self.token}

    # -- inspection helpers -----------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._json(self.client.get("/_sandbox/health"))

    def stats(self) -> dict[str, Any]:
        return self._json(self.client.get("/_sandbox/stats"))

    def messages(self, **filters: Any) -> list[dict[str, Any]]:
        """All stored messages (filters: conversation_id, inbox_id, contact_id, status, account_id)."""
        params = {key: str(value) for key, value in filters.items() if value is not None}
        return self._json(self.client.get("/_sandbox/messages", params=params))["messages"]

    def messages_per_event(self) -> Counter[str]:
        """How many messages the sandbox holds for each event, read from the content the tests send
        (``Reminder <event_id>: ...``, :func:`tests.support.dispatcher_setup.reminder`)."""
        counts: Counter[str] = Counter()
        for message in self.messages():
            match = EVENT_IN_CONTENT.match(message.get("content") or "")
            if match:
                counts[match.group(1)] += 1
        return counts

    def faults(self) -> dict[str, Any]:
        return self._json(self.client.get("/_sandbox/faults"))

    def set_faults(self, faults: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """Replace the whole fault table: ``{"createMessage": {"server_error_share": 1.0}}``."""
        return self._json(self.client.put("/_sandbox/faults", json=dict(faults)))

    def reset(self) -> dict[str, Any]:
        """Back to the seed: data, counters and faults as configured at start."""
        return self._json(self.client.post("/_sandbox/reset"))

    def revoke_token(self, token: str | None = None) -> dict[str, Any]:
        """Revoke an API token (the default account's unless another is named): the workspace answers
        401 to it until :meth:`reset`."""
        return self._json(self.client.post("/_sandbox/tokens/revoke", json={"token": token or self.token}))

    def incoming(
        self,
        *,
        contact_id: int | None = None,
        inbox_id: int | None = None,
        content: str = "Hello",
        account_id: int | None = None,
        conversation_id: int | None = None,
        age_s: float = 0.0,
    ) -> dict[str, Any]:
        """Simulate a customer's incoming message, in ``conversation_id`` or on the contact/inbox pair
        (opens the 24-hour window unless ``age_s`` is older)."""
        body: dict[str, Any] = {"account_id": account_id or self.account_id, "content": content, "age_s": age_s}
        for key, value in (("contact_id", contact_id), ("inbox_id", inbox_id), ("conversation_id", conversation_id)):
            if value is not None:
                body[key] = value
        return self._json(self.client.post("/_sandbox/incoming", json=body))

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        response.raise_for_status()
        return response.json()


def _write_config(config_text: str, directory: Path) -> Path:
    path = directory / "sandbox.toml"
    path.write_text(config_text, encoding="utf-8")
    return path


def _wait_healthy(proc: subprocess.Popen[bytes], base_url: str, *, timeout_s: float) -> bool:
    """True once /_sandbox/health answers 200 from ``proc`` itself; False if the process exited first.

    The pid is compared because the port was chosen free a moment before: another test's sandbox
    may have taken it meanwhile, and its answer must not pass for this one's (ours then fails to bind
    and is retried on another port)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                answer = client.get(f"{base_url}/_sandbox/health")
                if answer.status_code == 200 and answer.json().get("pid") == proc.pid:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextlib.contextmanager
def running_sandbox(
    config_text: str | None = None,
    *,
    profile: str | None = None,
    state_file: Path | None = None,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = 10.0,
    attempts: int = 3,
) -> Iterator[SandboxProcess]:
    """Start ``python -m sandbox`` on a free loopback port, wait until healthy, stop it on exit.

    ``config_text`` is TOML in the format of ``sandbox/seed.default.toml``; sections it leaves out keep
    their defaults. ``profile``: None runs the default (stock), as users meet it; "contract" for
    tests of tolerance. State is kept in ``state_file`` (default: a file in a temporary folder, so
    every test runs with persistence on, as users do). ``port``: this one (a restart on the same
    address); by default a free one, and a port taken between choosing and binding is retried up to
    ``attempts`` times.
    """
    with tempfile.TemporaryDirectory(prefix="sandbox-") as tmp:
        tmp_dir = Path(tmp)
        args = [*extra_args]
        if config_text is not None:
            args += ["--config", str(_write_config(config_text, tmp_dir))]
        if profile is not None:
            args += ["--profile", profile]
        if "--in-memory" not in args and "--state" not in args:
            args += ["--state", str(state_file or tmp_dir / "state.jsonl")]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        last_error = ""
        for attempt in range(attempts):
            chosen = port or free_port()
            stderr_path = tmp_dir / f"stderr-{attempt}.log"
            with stderr_path.open("wb") as stderr_file:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "sandbox", "--host", "127.0.0.1", "--port", str(chosen), *args],
                    cwd=REPO_ROOT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr_file,
                )
            handle = SandboxProcess(proc=proc, port=chosen, stderr_path=stderr_path)
            if _wait_healthy(proc, handle.base_url, timeout_s=startup_timeout_s):
                break
            _stop(proc)
            handle.client.close()
            last_error = handle.stderr_text()
            if "address already in use" not in last_error.lower():
                raise SandboxCrashed(f"sandbox did not become healthy:\n{last_error[-4000:]}")
        else:
            raise SandboxCrashed(f"sandbox could not bind a port:\n{last_error[-4000:]}")
        try:
            yield handle
        finally:
            crashed = proc.poll() is not None
            _stop(proc)
            handle.client.close()
            if crashed and sys.exc_info()[0] is None:
                raise SandboxCrashed(
                    f"sandbox exited with {proc.returncode} during the test:\n{handle.stderr_text()[-4000:]}"
                )


# -- pytest fixtures: import these names into a conftest.py ------------------------------------
@pytest.fixture(scope="session")
def sandbox_session() -> Iterator[SandboxProcess]:
    """One sandbox with the default seed for the whole session."""
    with running_sandbox() as handle:
        yield handle


@pytest.fixture()
def sandbox(sandbox_session: SandboxProcess) -> SandboxProcess:
    """The session sandbox, reset to its seed (data, counters, faults) before each test."""
    sandbox_session.reset()
    return sandbox_session


@pytest.fixture(scope="session")
def contract_sandbox_session() -> Iterator[SandboxProcess]:
    """One sandbox on the contract profile for the whole session (tests of tolerance)."""
    with running_sandbox(profile="contract") as handle:
        yield handle


@pytest.fixture()
def contract_sandbox(contract_sandbox_session: SandboxProcess) -> SandboxProcess:
    """The contract-profile session sandbox, reset before each test."""
    contract_sandbox_session.reset()
    return contract_sandbox_session
