"""Deliver the host's outcome callbacks: at least once, signed, with backoff and jitter, for
``callback_max_age_s``; a URL that fails every delivery for ``callback_pause_after_s`` is paused,
with why, until an operator resumes it (``dispatcher callbacks retry``).

Each run takes a batch of due events in one short transaction (leasing them), POSTs them outside
any transaction, and records what became of each in another. A run that dies in between leaves
its batch to the next run once the lease passes: an event may then arrive twice, under the same
``webhook-id``, which a host de-duplicates (Standard Webhooks says so).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.callbacks import signing
from dispatcher.settings import Settings
from dispatcher.store import callbacks as outbox
from dispatcher.store.callbacks import DueCallback
from dispatcher.store.models import utcnow

log = logging.getLogger(__name__)

BATCH = 50  # POSTed one after another: the batch's lease covers every one of them timing out
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 1800.0  # half an hour between tries at most: ~100 tries over the two days an event is kept


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0
    expired: int = 0
    parked: int = 0
    paused_urls: int = 0


def body_of(event: DueCallback) -> bytes:
    """The event as the host receives it (Standard Webhooks' type, timestamp, data): IDs, state,
    attempt, channel, error kind, times and the per-notification sequence; nothing else."""
    return json.dumps({
        "type": event.type,
        "timestamp": event.occurred_at.isoformat(),
        "data": {"event_id": event.event_id, "state": event.state, "attempt": event.attempt, "channel": event.channel,
                 "error_kind": event.error_kind, "sequence": event.sequence,
                 "occurred_at": event.occurred_at.isoformat()},
    }, separators=(",", ":")).encode()


def webhook_id(event: DueCallback) -> str:
    return f"msg_{event.id}"


def delay_s(tries: int, rng: random.Random) -> float:
    """Exponential, capped, with jitter (half to all of it), after ``tries`` failed tries."""
    ceiling: float = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** min(tries, 20))
    return ceiling * rng.uniform(0.5, 1.0)


def deliver_due(sessions: sessionmaker[Session], settings: Settings, client: httpx.Client, *,
                clock: Callable[[], datetime] = utcnow, rng: random.Random | None = None,
                limit: int = BATCH) -> DeliveryReport:
    """One batch of due events, each POSTed once; what became of each is recorded."""
    rng = rng or random.Random()
    report = DeliveryReport()
    now = clock()
    with sessions.begin() as session:
        lease_s = settings.callback_timeout_s * limit + 30  # runs every sweep_interval_s: none takes another's
        events = outbox.take_due(session, now=now, hold_until=now + timedelta(seconds=lease_s), limit=limit)
        paused = outbox.paused_keys(session) if events else set()
    answers: list[tuple[DueCallback, str, str | None]] = []  # event, its URL's key, its error (None: delivered)
    to_park: list[int] = []
    to_expire: list[tuple[int, str]] = []
    for event in events:
        of_workspace = settings.for_workspace(event.workspace) if event.workspace in settings.workspaces else settings
        url = of_workspace.callback_url_for(event.route)
        if url is None:
            to_expire.append((event.id, "no callback URL is configured for its route"))
        elif (now - event.occurred_at).total_seconds() > settings.callback_max_age_s:
            to_expire.append((event.id, f"not delivered within callback_max_age_s ({settings.callback_max_age_s:.0f} s)"))
        elif outbox.url_key(url) in paused:
            to_park.append(event.id)
        else:
            answers.append((event, outbox.url_key(url), _post(client, url, event, of_workspace)))
    finished = clock()
    with sessions.begin() as session:
        outbox.delivered(session, [event.id for event, _key, error in answers if error is None], now=finished)
        outbox.parked(session, to_park)
        for callback_id, reason in to_expire:
            outbox.expired(session, callback_id, reason=reason)
        for event, key, error in answers:
            if error is None:
                outbox.endpoint_answered(session, key)
                continue
            outbox.failed(session, event.id, error=error,
                          next_try_at=finished + timedelta(seconds=delay_s(event.tries, rng)))
            if outbox.endpoint_failed(session, key, now=finished, error=error,
                                      pause_after=timedelta(seconds=settings.callback_pause_after_s)):
                report.paused_urls += 1
                log.warning("callback URL %s… paused: it failed every delivery for %.0f s (%s); "
                            "`dispatcher callbacks retry` resumes it", key[:12], settings.callback_pause_after_s, error)
    report.delivered = sum(1 for _event, _key, error in answers if error is None)
    report.failed = len(answers) - report.delivered
    report.expired, report.parked = len(to_expire), len(to_park)
    return report


def _post(client: httpx.Client, url: str, event: DueCallback, settings: Settings) -> str | None:
    """POST one event; None when the host took it (2xx), else why not, in words without its body.
    The timestamp is the wall clock's at sending: hosts refuse one far from their own."""
    body = body_of(event)
    headers = signing.headers(settings.callback_secrets, webhook_id=webhook_id(event),
                              timestamp=int(time.time()), body=body)
    try:
        response = client.post(url, content=body, headers=headers, timeout=settings.callback_timeout_s)
    except httpx.TimeoutException:
        return "timed out"
    except Exception as error:  # any failure is this event's, never the batch's: its class only, no URL
        return f"no answer ({type(error).__name__})"
    if 200 <= response.status_code < 300:
        return None
    return f"answered {response.status_code}"
