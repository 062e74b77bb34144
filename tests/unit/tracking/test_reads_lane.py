"""Tracking's status reads go through the reads lane of the shared limiter: a 429 answered to one
pauses every call, and the reads twice as long (a read-back, the consumer's read of a status-less
event); the reads the send path makes before a resend are part of the send and keep going while
the reads lane waits. No servers: a migrated SQLite store, the API behind httpx.MockTransport,
the limiter on an injected clock."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from dispatcher.api import RateLimited, WorkspaceClient
from dispatcher.context import (
    ACCOUNT_BUCKET,
    READS_BUCKET,
    READS_PAUSE_FACTOR,
    InboxDirectory,
    SendContext,
    Wait,
    limits_of,
    retry_plan_of,
)
from dispatcher.enqueue import ListEnqueuer
from dispatcher.policy.ratelimit import LocalLimiter
from dispatcher.sending.recover import find_sent_message
from dispatcher.store.db import make_engine, session_factory
from dispatcher.store.migrate import upgrade_database
from dispatcher.store.models import Attempt, Notification
from dispatcher.tracking.outcomes import apply_event, reconcile_attempt
from dispatcher.tracking.webhooks.events import EventSummary
from tests.support.reads_share import FakeClock, settings

pytestmark = pytest.mark.usefixtures("clean_environment")

NOW = datetime(2026, 11, 30, 18, 0, tzinfo=UTC)
MESSAGE_ID, CONVERSATION_ID = 901, 17
Handler = Callable[[httpx.Request], httpx.Response]


def too_many(retry_after: str | None = None) -> Handler:
    """The stock 429: text/plain "Retry later", a Retry-After only when asked for."""
    def answer(request: httpx.Request) -> httpx.Response:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        return httpx.Response(429, text="Retry later", headers=headers)
    return answer


def no_messages(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"meta": {}, "payload": []})


class World:
    """One sent attempt in the store, and a context whose API answers with ``handler``."""

    def __init__(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path}/reads.sqlite"
        upgrade_database(url)
        self.engine = make_engine(url)
        self.settings = settings(database_url=url)
        self.clock = FakeClock(5000.0)
        self.limiter = LocalLimiter(limits_of(self.settings), clock=self.clock)
        self.calls: list[str] = []
        self.handler: Handler = no_messages
        self.api = WorkspaceClient.from_settings(self.settings, transport=httpx.MockTransport(self._answer))
        self.context = SendContext(
            settings=self.settings, api=self.api, sessions=session_factory(self.engine), limiter=self.limiter,
            inboxes=InboxDirectory(list), plan=retry_plan_of(self.settings), rng=random.Random(4),
            clock=lambda: NOW, sleep=self._sleep)
        with self.context.sessions.begin() as session:
            notification = Notification(event_id="appt-1", fingerprint="f" * 64, route="sms", state="sent",
                                        created_at=NOW - timedelta(minutes=5), updated_at=NOW)
            session.add(notification)
            session.flush()
            attempt = Attempt(notification_id=notification.id, number=1, route="sms", channel="sms", state="sent",
                              tries=1, content_hash="c" * 64, message_id=MESSAGE_ID, conversation_id=CONVERSATION_ID,
                              accepted_at=NOW - timedelta(minutes=5))
            session.add(attempt)
            session.flush()
            self.attempt_id = attempt.id

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request.url.path.rsplit("/", 1)[-1])
        return self.handler(request)

    def _sleep(self, seconds: float) -> None:
        self.clock.now += seconds

    def granted(self, *buckets: str) -> bool:
        return self.limiter.acquire_many(buckets) == 0.0

    def close(self) -> None:
        self.api.close()
        self.engine.dispose()


@pytest.fixture()
def world(tmp_path: Path) -> Iterator[World]:
    built = World(tmp_path)
    yield built
    built.close()


def test_a_read_back_answered_429_pauses_every_call_and_the_reads_twice_as_long(world: World) -> None:
    # given a workspace that answers the read-back's listMessages with 429, Retry-After 3
    world.handler = too_many("3")
    # when the attempt is read back
    assert reconcile_attempt(world.attempt_id, world.context, ListEnqueuer()) == "unreadable"
    # then the limiter is paused: every call for the 3 s, the reads for twice that
    assert world.calls == ["messages"]
    assert world.limiter.paused_for() == pytest.approx(3.0)
    assert world.limiter.paused_for(READS_BUCKET) == pytest.approx(3.0 * READS_PAUSE_FACTOR)
    assert not world.granted(ACCOUNT_BUCKET)
    # and the sends are granted again after the 3 s, the reads only after the 6 s
    world.clock.now += 3.0
    assert world.granted(ACCOUNT_BUCKET) and not world.granted(ACCOUNT_BUCKET, READS_BUCKET)
    world.clock.now += 3.0
    assert world.granted(ACCOUNT_BUCKET, READS_BUCKET)


def test_the_consumer_s_status_read_answered_429_pauses_the_reads_lane(world: World) -> None:
    # given a status-less message_updated of our message, and a 429 without Retry-After (the stock one)
    world.handler = too_many()
    event = EventSummary(event="message_updated", message_id=MESSAGE_ID, message_type="outgoing")
    # when the consumer applies it, the read fails as before (the delivery's try is spent, the sweep republishes it)
    with pytest.raises(RateLimited):
        apply_event(event, world.context, ListEnqueuer())
    # and the limiter is paused as after a send's first 429 (the first backoff: 0.5-1 x retry_base_s),
    # the reads twice as long
    sends_s = world.limiter.paused_for()
    assert 0.5 * world.settings.retry_base_s <= sends_s <= world.settings.retry_base_s
    assert world.limiter.paused_for(READS_BUCKET) == pytest.approx(READS_PAUSE_FACTOR * sends_s)
    # so the next status read waits for the reads' pause, without calling the workspace
    world.context.max_inline_wait_s = 0.0
    with pytest.raises(Wait) as waited:
        apply_event(event, world.context, ListEnqueuer())
    assert waited.value.delay_s == pytest.approx(READS_PAUSE_FACTOR * sends_s)
    assert world.calls == ["messages"]


def test_reads_wait_for_their_lane_while_the_send_path_s_look_goes_on(world: World) -> None:
    # given the reads lane paused for a minute (an earlier 429), and no call refused otherwise
    world.limiter.pause(60.0, bucket=READS_BUCKET)
    world.context.max_inline_wait_s = 0.0
    # when tracking reads the attempt back, it waits for the lane, without calling the workspace
    with pytest.raises(Wait):
        reconcile_attempt(world.attempt_id, world.context, ListEnqueuer())
    assert world.calls == []
    # but the send path's look for an earlier try's message, part of a send, reads the conversation now
    assert find_sent_message(world.context, conversation_id=CONVERSATION_ID, content_hash="c" * 64,
                             since=NOW - timedelta(minutes=1)) is None
    assert world.calls == ["messages"]
