"""When to read an attempt back from the message list, and when to stop. Pure.

A stock workspace never retries a webhook, so an outcome whose webhook was lost is only learned by
reading the message list. A read-back is for an attempt whose outcome is not yet confirmed, and
costs one ``listMessages`` call of the workspace's budget, which sends share (the tracking reads
take at most their share of it, docs/tracking.md). The rule, by the attempt's state:

=================  ================================================================================
accepted, sent     unconfirmed: the first read ``first_after_s`` after its last news; then the
                   reads back off with the attempt's age (a quarter of it), never further apart
                   than ``max_interval_s``, so an outcome that happens within the horizon is
                   learned at most that long after it happened
delivered          on a channel that never reports ``read`` (SMS, e-mail, web session:
                   :data:`dispatcher.policy.channels.CHANNELS_REPORTING_READ`), nothing: the outcome
                   is final. Where ``read`` exists it comes from webhooks; one read,
                   ``first_after_s`` after the news of delivery, catches a ``read`` report lost
                   on its way, and none follows a read that found nothing new
read, failed       never (nor an attempt whose fallback has been decided: the caller leaves those out)
=================  ================================================================================

None ``horizon_s`` after acceptance. The budget, at the defaults (60 s, 300 s, an hour): a message
confirmed within a minute by its webhooks costs no read-back; one whose ``delivered`` webhook was
lost, one read; a delivered message on the platform whose ``read`` report was lost, one more; an
unconfirmed one is read 20 times in its hour at most (its route's delivery deadline usually
decides before, and a decided attempt is not read again). One read of a conversation answers
every attempt of ours on its page (reminders to one patient share a conversation).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from dispatcher.lifecycle.states import AttemptState

READ_BACK_STATES = frozenset({AttemptState.ACCEPTED, AttemptState.SENT, AttemptState.DELIVERED})
UNCONFIRMED_STATES = frozenset({AttemptState.ACCEPTED, AttemptState.SENT})


@dataclass(frozen=True, slots=True)
class ReadBackPlan:
    first_after_s: float = 60.0
    max_interval_s: float = 300.0
    horizon_s: float = 3600.0


def next_read_at(*, state: AttemptState, reports_read: bool, accepted_at: datetime, now: datetime,
                 plan: ReadBackPlan, after_read: bool = False) -> datetime | None:
    """When the attempt is read back next; None: never again. ``now`` is the moment of its last
    news, or, with ``after_read``, of a read-back that brought none. ``reports_read``: whether its
    channel ever reports ``read`` (:func:`dispatcher.policy.channels.reports_read`)."""
    end = accepted_at + timedelta(seconds=plan.horizon_s)
    if now >= end:
        return None
    if state in UNCONFIRMED_STATES:
        age_s = (now - accepted_at).total_seconds()
        interval_s = min(max(plan.first_after_s, age_s / 4), plan.max_interval_s)
        return min(now + timedelta(seconds=interval_s), end)
    if state is AttemptState.DELIVERED and reports_read and not after_read:
        return min(now + timedelta(seconds=plan.first_after_s), end)
    return None
