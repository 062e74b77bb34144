"""Cancel raced against real send workers: once ``cancel`` answers cancelled, nothing is sent.

Two Celery worker processes send through the sandbox (PostgreSQL store, Redis broker) while the
test cancels each notification at a moment drawn from a seed, from 0 to 500 ms after handing it
over: some cancels land before a worker opens the attempt, some between its read and its claim,
some after its call. The sandbox's own record is the judge: no message for an event whose cancel
answered cancelled, exactly one for an event whose cancel answered too late.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest

from dispatcher.errors import TooLate
from dispatcher.service import Dispatcher
from tests.integration.send.test_workers import setup
from tests.support.dispatcher_setup import reminder
from tests.support.sandbox_process import SandboxProcess
from tests.support.worker_process import ProcessGroup, wait_until

__all__ = ["setup"]  # the fixture: workers, broker and store of their own

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NOTIFICATIONS = 120
SEED = 24


def test_cancel_against_the_send_workers_never_lets_a_cancelled_notification_out(
    setup: tuple[Dispatcher, ProcessGroup], sandbox: SandboxProcess
) -> None:
    dispatcher, group = setup
    group.start_worker("w1")
    group.start_worker("w2")
    dispatcher.notify(reminder("cancel-race-warm-up", identifier="cancel-patient-warm-up", phone="+15550329999"))
    wait_until(lambda: dispatcher.status("cancel-race-warm-up").message_id is not None, timeout_s=60,
               what="the workers take notifications")
    rng = random.Random(SEED)
    delays = [rng.uniform(0.0, 0.5) for _ in range(NOTIFICATIONS)]
    answers: dict[str, str] = {}

    def hand_over_and_cancel(number: int) -> None:
        event_id = f"cancel-race-{number}"
        dispatcher.notify(reminder(event_id, identifier=f"cancel-patient-{number}", phone=f"+1555032{number:04d}"))
        time.sleep(delays[number])
        try:
            answers[event_id] = dispatcher.cancel(event_id).state
        except TooLate as late:
            answers[event_id] = f"too late ({late.state})"

    threads = [threading.Thread(target=hand_over_and_cancel, args=(number,)) for number in range(NOTIFICATIONS)]
    for thread in threads:
        thread.start()
        time.sleep(0.005)  # a steady hand-over, not one burst
    for thread in threads:
        thread.join(60)
    assert len(answers) == NOTIFICATIONS

    cancelled = [event for event, answer in answers.items() if answer == "cancelled"]
    too_late = [event for event, answer in answers.items() if answer.startswith("too late")]
    assert cancelled and too_late, Counter(answers.values())  # the race was run on both sides
    wait_until(lambda: all(dispatcher.status(event).message_id is not None for event in too_late),
               timeout_s=120, what="every notification cancelled too late is sent")
    group.stop_all()  # nothing more can be sent: the judgement below is final
    per_event = sandbox.messages_per_event()
    assert {event: per_event.get(event, 0) for event in cancelled} == {event: 0 for event in cancelled}
    assert {event: per_event.get(event, 0) for event in too_late} == {event: 1 for event in too_late}
    for event in cancelled:
        record = dispatcher.status(event)
        assert (record.state, record.error_kind, record.message_id) == ("cancelled", "cancelled", None)
