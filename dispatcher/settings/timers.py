"""How long things wait: retries and their backoff, the sweep, the breaker's pauses, the send
deadline, and when an unconfirmed message is read back."""

from __future__ import annotations

from pydantic import Field

from dispatcher.settings.checks import Concern


class Timers(Concern):
    retry_base_s: float = Field(default=1.0, gt=0)
    retry_cap_s: float = Field(default=60.0, gt=0)
    # Longer waits become a due time for the sweep. A countdown is held unacknowledged by the
    # worker that took it, and a Redis broker delivers it again once it outlives the visibility
    # timeout: so it stays below broker_visibility_timeout_s by COUNTDOWN_MARGIN_S (checked by Settings).
    retry_max_countdown_s: float = Field(default=20.0, gt=0)
    sweep_interval_s: float = Field(default=5.0, gt=0)
    # How long a row's task may be unseen before the sweep takes it as lost: a run's lease lapses
    # this long after the run last touched the row (it ended by an exception); a task published
    # and not started is taken as lost this long after its publish, but only while the send queue
    # is empty (a publisher that died before its publish, a broker restarted empty): a row waiting
    # in a backlog keeps its one task however long it waits (issue 44; docs/operations.md, "One
    # task per waiting row"). Short enough that lost work goes on within a minute without a backlog.
    stale_after_s: float = Field(default=45.0, gt=0)
    # The workspace refuses the token or cannot be reached: every worker waits (a circuit breaker),
    # first breaker_base_s, doubling up to breaker_cap_s, then one worker tries again.
    breaker_base_s: float = Field(default=5.0, gt=0)
    breaker_cap_s: float = Field(default=120.0, gt=0)
    # A notification not accepted this long after it was due fails, with the reason it waited for.
    send_deadline_s: float = Field(default=86400.0, gt=0)
    # An unconfirmed attempt is read back reconcile_after_s after its last news, then ever less
    # often (a quarter of its age, at most reconcile_max_interval_s apart), until reconcile_horizon_s
    # after its acceptance: a lost webhook's outcome is learned within reconcile_max_interval_s.
    reconcile_after_s: float = Field(default=60.0, gt=0)
    reconcile_max_interval_s: float = Field(default=300.0, gt=0)
    reconcile_horizon_s: float = Field(default=3600.0, gt=0)
    # A status-less webhook (a stock workspace's) is read at once when it is its message's first; one
    # after a read waits until this long after that read, so one read of the conversation answers
    # the burst of events that usually follows a send (docs/tracking.md).
    status_read_wait_s: float = Field(default=2.0, ge=0)
