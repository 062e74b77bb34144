"""Settings and a send context for tests that drive the send path against a real sandbox."""

from __future__ import annotations

import random
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from dispatcher.api import WorkspaceClient
from dispatcher.context import InboxDirectory, SendContext, limits_of, retry_plan_of
from dispatcher.policy.ratelimit import LocalLimiter
from dispatcher.sending.send import Outcome, SendResult, send_notification
from dispatcher.settings import Settings, load_settings
from dispatcher.store.db import session_factory, shared_engine
from dispatcher.store.migrate import upgrade_database
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "config" / "dispatcher.example.toml"


def example_settings(**overrides: Any) -> Settings:
    """The example configuration (it fits the sandbox's default seed), with overrides."""
    values: dict[str, Any] = tomllib.loads(EXAMPLE.read_text())
    values.update(overrides)
    return load_settings(**values)


@contextmanager
def send_context(settings: Settings, *, transport: httpx.BaseTransport | None = None) -> Iterator[SendContext]:
    """A send context over ``settings``; ``transport`` stands between the client and the workspace."""
    upgrade_database(settings.database_url)
    api = WorkspaceClient.from_settings(settings, transport=transport)
    try:
        yield SendContext(
            settings=settings,
            api=api,
            sessions=session_factory(shared_engine(settings.database_url)),
            limiter=LocalLimiter(limits_of(settings)),
            inboxes=InboxDirectory(api.list_inboxes),
            plan=retry_plan_of(settings),
            rng=random.Random(7),
            sleep=lambda _seconds: None,
        )
    finally:
        api.close()


def drive(context: SendContext, notification_id: int, *, max_runs: int = 30) -> list[SendResult]:
    """Run the send path until it stops asking for a retry (the waits are skipped)."""
    results = []
    for _ in range(max_runs):
        result = send_notification(notification_id, context)
        results.append(result)
        if result.outcome is not Outcome.RETRY:
            return results
    raise AssertionError(f"still retrying after {max_runs} runs: {[r.reason for r in results[-3:]]}")


def reminder(event_id: str, *, identifier: str, phone: str, route: str = "reminders", **extra: Any) -> dict[str, Any]:
    """A valid appointment-reminder request for the example configuration."""
    return {
        "event_id": event_id,
        "route": route,
        "contact": {"identifier": identifier, "phone_number": phone, "name": "Test Patient"},
        "content": f"Reminder {event_id}: your appointment is tomorrow at 09:00",
        "template": {
            "name": "appointment_reminder",
            "language": "en",
            "category": "UTILITY",
            "params": {"1": "Test Patient", "2": "tomorrow 09:00"},
        },
        **extra,
    }
