"""Run, replay and shrink simulated worlds; the command line is tests/simulation/__main__.py."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from dispatcher.settings import Settings
from tests.simulation import invariants, stores
from tests.simulation.workspace import WORKSPACE_URL
from tests.simulation.world import Choices, Outcome, World, WorldSpec
from tests.support.dispatcher_setup import example_settings


@cache
def settings_for(secret: str) -> Settings:
    """The example configuration at its defaults, pointed at the simulated workspace."""
    return example_settings(api_url=WORKSPACE_URL, webhook_secrets=[secret], database_url="sqlite://")


def world_of(spec: WorldSpec, *, seed: int | None = None, script: list[int] | None = None,
             keep_trace: bool = True, strict: bool = False) -> World:
    """A world set up for one run (a test that looks at the workspace afterwards runs it itself)."""
    return World(spec, Choices(seed=seed, script=script, strict=strict), settings=settings_for,
                 store=stores.OPENERS[spec.store], checks=invariants.check, as_time=invariants.as_time,
                 keep_trace=keep_trace, finals=invariants.at_end)


def run(spec: WorldSpec, *, seed: int | None = None, script: list[int] | None = None,
        keep_trace: bool = True, strict: bool = False) -> Outcome:
    """One run from a seed, or from a script of choices (``strict``: stop where the script ends)."""
    return world_of(spec, seed=seed, script=script, keep_trace=keep_trace, strict=strict).run()


def shrink(spec: WorldSpec, choices: list[int], fails: Callable[[Outcome], bool], *, budget: int = 600) -> list[int]:
    """A shorter, plainer list of choices that still fails: cut the tail, drop single choices,
    turn choices into 0 (the plain step, no fault), until nothing helps or the budget is spent."""
    best = list(choices)
    tries = 0

    def still_fails(candidate: list[int]) -> bool:
        nonlocal tries
        tries += 1
        return fails(run(spec, script=candidate, keep_trace=False))

    improved = True
    while improved and tries < budget:
        improved = False
        cut = len(best) // 2
        while cut > 0 and tries < budget:
            if still_fails(best[: len(best) - cut]):
                best, improved = best[: len(best) - cut], True
            else:
                cut //= 2
        index = len(best) - 1
        while index >= 0 and tries < budget:
            for candidate in (best[:index] + best[index + 1:], best[:index] + [0] + best[index + 1:]):
                if candidate != best and still_fails(candidate):
                    best, improved = candidate, True
                    break
            index = min(index - 1, len(best) - 1)
    while best and best[-1] == 0:
        best.pop()
    return best


WORLDS: dict[str, WorldSpec] = {
    "small": WorldSpec(),  # 5 notifications, 5 faults: the README's test command runs thousands of these
    # The production store: the small world on PostgreSQL, where the moves run as one statement
    # each (data-modifying CTEs); SQLite runs the same guards in two.
    "postgresql": WorldSpec(store="postgresql"),
    # Two patients, four reminders: a patient's reminders on one route share a conversation, so
    # one read of it answers for both (the stock workspace's events carry no status).
    "shared-patients": WorldSpec(notifications=4, faults=5, patients=2, kind_pool=(0, 1, 2), opt_outs=False),
    # The receiver's group commit: deliveries that arrive together are recorded in one transaction
    # and published as one consumer task, which applies those with a status in one transaction and
    # the others one by one; on the contract's workspace (events with a status: most go together)
    # and on the stock one (no status: they wait, and run again as one task).
    "group-commit": WorldSpec(profile="contract", receiver_group=4, kind_count=6),
    "group-commit-stock": WorldSpec(receiver_group=4, kind_count=6),
    "group-commit-postgresql": WorldSpec(profile="contract", receiver_group=4, kind_count=6, store="postgresql"),
    "large": WorldSpec(notifications=100, faults=50, max_steps=400_000),
    # Two workers fighting over few notifications: twin deliveries, crashes of send workers, lost
    # answers and refusals, so claims, leases and releases meet each other often.
    "contention": WorldSpec(notifications=2, faults=12, fault_rate=0.3, opt_outs=False,
                            crash_nodes=frozenset({"worker"}), webhook_faults=False),
    # Exhaustive small worlds (explore.py): one SMS notification, two workers, one consumer; every
    # webhook delivered, delivered after the next one, twice or never; with no crash, or one crash
    # of a worker or the consumer at any of its points (its pool child: the task is requeued).
    "exhaustive": WorldSpec(notifications=1, faults=0, opt_outs=False, fixed_host=True, kinds=(2,), call_faults=False,
                            in_transaction_crashes=False, webhook_faults_free=True, duplicates=False,
                            crash_per_point=True, lost_workers=False, crash_nodes=frozenset({"worker", "consumer"}),
                            fault_rate=0.5),
    "exhaustive-crash": WorldSpec(notifications=1, faults=1, opt_outs=False, fixed_host=True, kinds=(2,),
                                  call_faults=False, in_transaction_crashes=False, webhook_faults_free=True,
                                  duplicates=False, crash_per_point=True, lost_workers=False,
                                  crash_nodes=frozenset({"worker", "consumer"}), fault_rate=0.5),
    # Refusals: createMessage and the lookups refused outright (422) besides the transient faults,
    # and recipients whom the platform, or neither channel, reaches, or who never confirm: attempts
    # fail before and after a message exists, fallbacks are decided and fail in turn.
    "refusals": WorldSpec(notifications=3, faults=12, fault_rate=0.25, refusals=True, kind_count=6),
    # Opt-outs that come before, during and after the claims (the host suppresses, or the recipient
    # replies STOP in its SMS conversation, or else on the platform).
    "opt-outs": WorldSpec(notifications=3, faults=3, opt_out_each=True, opt_out_within_s=15, kind_count=6),
    # A send task that keeps dying: set aside after send_max_runs deaths, retried by an operator.
    "crash-loop": WorldSpec(notifications=1, faults=40, fault_rate=1.0, opt_outs=False, crash_nodes=frozenset({"worker"}),
                            crash_within_points=2, crash_skip_points=2, in_transaction_crashes=False, duplicates=False, call_faults=False,
                            webhook_faults=False, operator=True),
    # Lost answers: createMessage and the reads that look for its message fail often (answers lost,
    # refused, throttled), to patients whose service window closes as they are sent, so that the
    # look before a resend, its own failures and the 131047 resend as a template meet.
    "lost-answers": WorldSpec(notifications=2, faults=10, fault_rate=0.5, opt_outs=False, kinds=(6, 6),
                              call_fault_operations=("/messages",), crash_nodes=frozenset(), duplicates=False,
                              webhook_faults=False, in_transaction_crashes=False),
    # The same, and a createMessage answered 200 by a page no one can read while the call never
    # reached the workspace: the attempt is looked for and never resent, and the look finds nothing
    # (not_found_after_unknown_outcome), or finds a message an earlier, lost answer made.
    "unreadable-answers": WorldSpec(notifications=2, faults=10, fault_rate=0.5, opt_outs=False, kinds=(6, 6),
                                    call_fault_operations=("/messages",), crash_nodes=frozenset(), duplicates=False,
                                    webhook_faults=False, in_transaction_crashes=False, unreadable_answers=True),
    # Cancels (issue 15) before, between and after the claims, with crashes of the host (it asks
    # again), the workers and the sweeps: a cancel that answered cancelled lets nothing out.
    "cancels": WorldSpec(notifications=3, faults=6, fault_rate=0.15, cancels=True, cancel_within_s=8, kind_count=6),
    # Scheduled notifications (due up to 30 s after their hand-over), moved by the host before, as
    # or after their time comes, and cancelled: the sweep's release meets reschedules and cancels.
    "schedules": WorldSpec(notifications=3, faults=6, fault_rate=0.15, cancels=True, cancel_within_s=30,
                           scheduled=True, kind_count=6),
    # Refusals by the provider that we learn of only from the message's failure: a template that
    # fails after the 131047 resend (7), and numbers that replied STOP to the SMS provider before
    # the run, as a fallback (8) or as the first route (9): 21610, an opt-out recorded from it.
    "provider-refusals": WorldSpec(notifications=3, faults=4, fault_rate=0.1, kind_pool=(6, 7, 8, 9)),
    # A workspace outage (every call refused 401, or never connecting) for half the send deadline
    # or past it. The one world that changes a setting: send_deadline_s 300 s instead of a day, so
    # that an outage past it takes 70 sweeps of simulated time, not 17,000; the moves and the
    # branches it reaches are the same.
    "outage": WorldSpec(notifications=3, faults=2, fault_rate=0.1, outage=True, kind_count=4,
                        settings_changes=(("send_deadline_s", 300.0),)),
    # A host that retries each failed notification once, 30 s after it failed (the real retry:
    # a new attempt on its own route, no second fallback), among refusals and provider opt-outs.
    "retries": WorldSpec(notifications=3, faults=8, fault_rate=0.2, refusals=True, kind_pool=(0, 2, 3, 5, 8, 9),
                         host_retries=True),
    # Quiet hours, as a clinic sets them (the clock starts at 08:00 UTC): the platform route opens
    # at 08:01, so every hand-over waits for it; the SMS route sends from 08:02 to 08:03 only, so a
    # refused first route's fallback waits for it, and a deadline's fallback (at 08:15) finds its
    # next opening past the send deadline and fails saying so.
    "quiet-hours": WorldSpec(notifications=3, faults=4, fault_rate=0.1, kind_count=6,
                             route_windows=(("reminders", "08:01-20:00"), ("sms", "08:02-08:03"))),
    # The contract's nominal workspace (its events carry the status, and it retries a failed
    # delivery), which the client accepts besides the stock one.
    "contract": WorldSpec(profile="contract", kind_count=6),
    # The broker refuses publishes now and then (Redis away for a moment): a decision's fallback,
    # a retry, a template resend and the sweep's own batches are left to the next sweep.
    "publish-refusals": WorldSpec(notifications=3, faults=8, fault_rate=0.2, publish_refusals=6, refusals=True,
                                  kind_count=6),
    # The workspace as its administrators left it, not as the configuration assumes: patients whose
    # contact the front desk made with an e-mail address only (kind 10: not_contactable on both
    # routes) among ordinary ones, and a workspace whose SMS inbox was removed (inbox_not_found on
    # the SMS route and on every fallback to it).
    "front-desk-contacts": WorldSpec(notifications=3, faults=6, fault_rate=0.15, kind_pool=(0, 2, 10)),
    "removed-inbox": WorldSpec(notifications=3, faults=6, fault_rate=0.15, kind_pool=(0, 2, 3, 10), removed_inboxes=(2,)),
    # A host that hands its events over in batches (notify_many: one transaction, one broker batch),
    # again after its crash; among its recipients, SMS ones no route reaches and none falls back for
    # (kind 11: the notification fails external_error, with no fallback decided).
    "batches": WorldSpec(notifications=4, faults=6, fault_rate=0.15, batches=True, kind_pool=(0, 2, 3, 11)),
    # An operator withdraws the reminders' template from the registry while scheduled reminders
    # wait (a redeploy): what still needs the template fails invalid_for_channel and falls back.
    "withdrawn-template": WorldSpec(notifications=3, faults=4, fault_rate=0.1, scheduled=True, template_withdrawn=True,
                                    kind_pool=(0, 2, 3, 6)),
    # The field's out-of-order status (issue 44): some WhatsApp reminders go delivered, then a late
    # `sent` 50 ms to 0.3 s later (drawn per run), and are never read (kind 12), among ordinary ones
    # and a refusal that rightly falls back. A fallback for a message that arrived is a second message.
    "out-of-order": WorldSpec(notifications=3, faults=4, fault_rate=0.1, kind_pool=(0, 2, 3, 12, 12),
                              late_sent_between_s=(0.05, 0.3)),
    # tracing on (an in-memory exporter): the outcomes applied leave their spans (docs/tracing.md)
    "traced": WorldSpec(notifications=3, faults=5, traced=True),
    # issue 22's loss: crashes and redeliveries of the send task spent the provider tries
    "redeliveries": WorldSpec(notifications=1, faults=80, fault_rate=0.6, opt_outs=False,
                              crash_nodes=frozenset({"worker"}), webhook_faults=False),
}
