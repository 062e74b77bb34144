"""What a send task does after one run: end, or come back after a countdown.

Shared by the Celery task (workers/tasks.py) and the deterministic simulation, so both turn a
:class:`~dispatcher.sending.send.SendResult` into the same next step.
"""

from __future__ import annotations

from datetime import timedelta

from dispatcher.context import SendContext
from dispatcher.sending.send import Outcome, SendResult
from dispatcher.store import queries as store

MIN_COUNTDOWN_S = 0.05


def schedule_next_run(notification_id: int, result: SendResult, ctx: SendContext) -> float | None:
    """The countdown of the task's retry, or None when this task ends here: the run finished, or
    its wait is too long for a broker countdown and is kept as a due time for the sweep."""
    if result.outcome is not Outcome.RETRY:
        return None
    if result.deferred:  # the send path says when a wait is too long for a broker countdown
        with ctx.sessions.begin() as session:
            store.defer(session, notification_id, at=ctx.clock() + timedelta(seconds=result.delay_s))
        return None
    countdown = max(result.delay_s, MIN_COUNTDOWN_S)
    with ctx.sessions.begin() as session:  # the sweep leaves the row alone until then
        store.expect_run(session, notification_id, at=ctx.clock() + timedelta(seconds=countdown))
    return countdown
