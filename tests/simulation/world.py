"""One simulated world: our real code in processes that a seeded scheduler runs one step at a time.

A *node* is a process of ours (send workers, the outcome consumer, beat's sweeps, the webhook
receiver, the host that hands events over). Each task a node runs is a greenlet executing the real
code (``send_notification``, ``process_delivery``, ``tracking_sweep``, ``accept``, the receiver's
``delivery_reader`` and ``record_deliveries``). At every crash point (dispatcher/faults.py) outside
a store transaction the greenlet hands control back to the scheduler, which picks the next step
among everything that could happen now: another node's step, a broker delivery, a webhook, a
sandbox timer. A crash at a point throws :class:`SimCrash` into the greenlet: the transaction in
flight is discarded, the node's memory (its SendContext: caches, limiter, breaker) is dropped,
and its task goes back to the broker as Celery's settings make it (at once when only the pool
child dies, after the visibility timeout when the whole worker is lost).

Every choice (which step, which fault) comes from :class:`Choices`, so a seed replays exactly and
a recorded list of choices replays a run without its seed (the shrinker edits such lists).
"""

from __future__ import annotations

import heapq
import json
import logging
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from greenlet import greenlet
from sqlalchemy import Engine

from dispatcher import faults, tracing
from dispatcher.api import WorkspaceClient
from dispatcher.api.errors import ApiError
from dispatcher.context import InboxDirectory, SendContext, Wait, limits_of, retry_plan_of
from dispatcher.errors import InvalidEvent, StateConflict, TooLate, UnknownNotification
from dispatcher.intake.accept import accept
from dispatcher.intake.batch import ItemOutcome, accept_many
from dispatcher.intake.request import NotificationRequest
from dispatcher.lifecycle.moves import CRASH_LOOP, SET_ASIDE_KINDS
from dispatcher.lifecycle.states import CANCELLABLE_NOTIFICATION_STATES, SENDABLE_NOTIFICATION_STATES, AttemptState
from dispatcher.operations import set_aside
from dispatcher.operations.cancel import cancel as cancel_notification
from dispatcher.operations.cancel import reschedule as reschedule_notification
from dispatcher.operations.retry import retry as retry_notification
from dispatcher.operations.sweep import sweep as run_sweep
from dispatcher.policy.breaker import BreakerPlan, LocalBreaker
from dispatcher.policy.ratelimit import LocalLimiter
from dispatcher.recipients.controls import Recipients
from dispatcher.sending.next_run import schedule_next_run
from dispatcher.sending.send import Outcome as SendOutcome
from dispatcher.sending.send import send_notification
from dispatcher.settings import Settings
from dispatcher.store.db import session_factory
from dispatcher.tracking.reconcile import process_deliveries, process_delivery, tracking_sweep
from dispatcher.tracking.webhooks.deliveries import record_deliveries
from dispatcher.tracking.webhooks.receiver import delivery_reader
from tests.simulation.clock import SimClock, simulated_time
from tests.simulation.stores import Reads
from tests.simulation.workspace import BASE_FAULTS, CALL_FAULTS, UNREACHABLE_PREFIX, SimWorkspace

SEND, OUTCOME = "send", "outcome"
OUTCOMES = "outcomes"  # several deliveries, the receiver's group commit (arg: a tuple of row IDs)
STOP_CHANNELS = {2: "sms", 1: "messaging_platform"}  # the inboxes a recipient may reply STOP in, and their channels
STOP_REPLY_WAITS = 6  # a STOP reply waits up to this many times 10 s for the recipient's SMS conversation
OPERATOR_DELAY_S = 60.0  # how long a notification stays set aside before the operator retries it
HOST_RETRY_DELAY_S = 30.0  # how long after a notification failed its host retries it (the retries world)
# Kind 6: the service window closes 0 to 55 ms after the hand-over, in 5 ms steps: about as long as
# a run takes (a step is a millisecond) from reading the window to its createMessage call.
WINDOW_CLOSE_STEP_S, WINDOW_CLOSE_STEPS = 0.005, 12
# Kind 12: the stock seed's recipients whose messages go delivered, then a late `sent`, and nothing
# more (the regress rule with then_read = false); the late sent's delay is drawn in these steps.
LATE_SENT_PREFIX = "+1555071"
LATE_SENT_STEP_S = 0.01
CRASH_POINTS_PER_RUN = 10
TEMPLATE_NAME = "appointment_reminder"  # the approved template every platform request carries
IN_TRANSACTION_RARITY = 4  # a crash inside a transaction is drawn at a quarter of the fault rate (many points)


class SimCrash(BaseException):
    """The process dies here. A BaseException: no ``except Exception`` of ours may swallow it."""


class OutOfChoices(BaseException):
    """A strict scripted run reached a choice its script does not make (the explorer branches there)."""

    def __init__(self, options: int) -> None:
        super().__init__(options)
        self.options = options


# -- choices --------------------------------------------------------------------------------


class Choices:
    """Every nondeterministic choice of a run, drawn from a seed or replayed from a list.

    A choice is an int; 0 is the plain one (the first enabled step, no fault), so the shrinker
    simplifies a run by turning choices into 0 and cutting the list."""

    def __init__(self, seed: int | None = None, script: list[int] | None = None, *, strict: bool = False) -> None:
        self.rng = random.Random(seed)
        self.script = script
        self.strict = strict  # past the script: stop (OutOfChoices) instead of taking the plain choice
        self.made: list[int] = []

    def pick(self, options: int) -> int:
        if options <= 1:
            return 0
        if self.script is not None:
            index = len(self.made)
            if index >= len(self.script) and self.strict:
                raise OutOfChoices(options)
            value = self.script[index] % options if index < len(self.script) else 0
        else:
            value = self.rng.randrange(options)
        self.made.append(value)
        return value

    def chance(self, probability: float, options: int) -> int:
        """0 (nothing happens) or, with ``probability``, one of 1..options-1."""
        if self.script is not None:
            return self.pick(options)
        value = self.rng.randrange(1, options) if self.rng.random() < probability else 0
        self.made.append(value)
        return value


# -- the broker ------------------------------------------------------------------------------


@dataclass(order=True)
class Task:
    due: float
    seq: int
    kind: str = field(compare=False)
    arg: Any = field(compare=False)  # a notification or delivery row ID; a tuple of delivery row IDs for OUTCOMES
    holder: str | None = field(default=None, compare=False)  # a worker keeping its own countdown (ETA) task

    def __str__(self) -> str:
        if self.kind == OUTCOMES:
            return f"{self.kind} {'+'.join(f'd{row_id}' for row_id in self.arg)}"
        return f"{self.kind} {'n' if self.kind == SEND else 'd'}{self.arg}"


class Broker:
    """At least once, as Celery with ``task_acks_late`` and ``task_reject_on_worker_lost`` gives it:
    a task is acknowledged when its run ends; a pool child that dies has its task requeued at once;
    a whole worker lost (SIGKILL, a lost machine) has its running and countdown tasks come back
    after ``visibility_timeout_s`` (the Redis transport). A task may also be delivered twice."""

    def __init__(self, visibility_timeout_s: float) -> None:
        self.visibility_timeout_s = visibility_timeout_s
        self.tasks: list[Task] = []
        self._seq = 0

    def publish(self, kind: str, arg: Any, due: float, *, holder: str | None = None) -> Task:
        self._seq += 1
        task = Task(due, self._seq, kind, arg, holder)
        heapq.heappush(self.tasks, task)
        return task

    def ready(self, kinds: tuple[str, ...], node: str, now: float) -> Task | None:
        for task in sorted(self.tasks):
            if task.due > now:
                return None
            if task.kind in kinds and task.holder in (None, node):
                return task
        return None

    def take(self, task: Task) -> None:
        self.tasks.remove(task)
        heapq.heapify(self.tasks)

    def worker_lost(self, node: str, running: Task | None, now: float) -> None:
        back = now + self.visibility_timeout_s
        for task in self.tasks:
            if task.holder == node:
                task.holder, task.due = None, max(task.due, back)
        heapq.heapify(self.tasks)
        if running is not None:
            self.publish(running.kind, running.arg, back)

    def next_due(self) -> float | None:
        return min((task.due for task in self.tasks), default=None)


# In a group-commit world, how long a lone delivery waits at the receiver for others to join it
RECEIVER_HOLD_S = 2.0
PUBLISH_REFUSAL_RATE = 0.5  # the chance a publish is refused, while the world's publish_refusals last
SENDABLE_STATES = frozenset(state.value for state in SENDABLE_NOTIFICATION_STATES)


def as_time(value: object) -> datetime:
    """A UTCDateTime column read without the ORM: ISO text on SQLite, a datetime on PostgreSQL."""
    moment = datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# -- the logs --------------------------------------------------------------------------------


class LogWatch(logging.Handler):
    """Every record our code logs during a run, at INFO and up, kept for the checks (which format
    it as an operator's log would) instead of printed."""

    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.INFO)
        self.into = into
        self.logger = logging.getLogger("dispatcher")

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)

    def __enter__(self) -> LogWatch:
        self.saved = (self.logger.level, self.logger.propagate)
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.level, self.logger.propagate = self.saved


# -- the world -------------------------------------------------------------------------------


@dataclass
class Node:
    name: str
    kind: str  # "worker", "consumer", "beat", "receiver", "host"
    context: SendContext | None = None  # the process's memory; None after a crash
    run: greenlet | None = None
    task: Task | None = None
    doing: str = ""
    at: str = ""  # the crash point where its run waits
    down_until: float | None = None
    points: int = 0  # crash points its run has passed
    restarts: int = 0
    memory_loss: int = 0  # how its last crash went: 1 the pool child died, 2 the whole worker was lost
    crash_at: int = 0  # the point at which its run dies (0: it does not)
    began: datetime | None = None  # when its run began (simulated UTC)
    config_version: int = 0  # the configuration its process memory was built from (World.config_version)

    @property
    def busy(self) -> bool:
        return self.run is not None


@dataclass(frozen=True)
class HostEvent:
    at: float
    kind: str  # "notify", "suppress", "stop_reply", "cancel"
    index: int  # the notification (or recipient) it is about
    waited: int = 0  # a STOP reply put off because the recipient had no SMS conversation yet


@dataclass(frozen=True)
class Outage:
    start: float
    end: float
    fault: int  # the CALL_FAULTS entry every call meets meanwhile


@dataclass(frozen=True)
class WorldSpec:
    notifications: int = 5
    faults: int = 5
    workers: int = 2
    fault_rate: float = 0.08  # the chance of a fault at a point where one may happen, while budget remains
    opt_outs: bool = True
    # Which faults the scheduler may inject: crashes (of these kinds of node), a task delivered
    # twice, a faulty API call, a webhook dropped or delivered twice.
    crash_nodes: frozenset[str] = frozenset({"worker", "consumer", "beat", "receiver", "host"})
    duplicates: bool = True
    call_faults: bool = True
    webhook_faults: bool = True
    webhook_faults_free: bool = False  # webhook faults do not count against ``faults`` (every webhook may have one)
    in_transaction_crashes: bool = True
    lost_workers: bool = True  # a crash may lose the whole worker (its tasks back after the visibility timeout)
    crash_per_point: bool = False  # a crash is chosen at each point (exhaustive worlds), not once per run
    fixed_host: bool = False  # every event handed over at the start, no opt-out: no choices before the first step
    kinds: tuple[int, ...] = ()  # the notifications' kinds (see World._request); empty: chosen by the seed
    kind_count: int = 4  # how many kinds the seed chooses among (the first four: the worlds' regression seeds keep theirs)
    refusals: bool = False  # an API call may also be refused outright (422): attempts and fallbacks fail
    unreadable_answers: bool = False  # an API call may also be answered 200 with a page no one can read, undone
    opt_out_each: bool = False  # every recipient may opt out (else one at most)
    opt_out_within_s: int = 120  # the opt-out comes this soon after the start (sooner: more of them come before a claim)
    crash_within_points: int = CRASH_POINTS_PER_RUN  # a run chosen to die dies at one of its first this many points,
    crash_skip_points: int = 0  # after this many (a crash loop past the inbox listing, in the attempt's own steps)
    call_fault_operations: tuple[str, ...] = ()  # faults only on calls whose path holds one of these (empty: every call)
    operator: bool = False  # an operator retries notifications set aside (crash_loop), a minute after they are
    host_retries: bool = False  # the host retries each failed notification once, HOST_RETRY_DELAY_S after it failed
    cancels: bool = False  # the host may cancel each notification, up to cancel_within_s after handing it over
    cancel_within_s: int = 10
    # some notifications are scheduled (due up to scheduled_within_s after their hand-over), and the
    # host may move one before, as or after its time comes
    scheduled: bool = False
    scheduled_within_s: int = 30
    kind_pool: tuple[int, ...] = ()  # the kinds the seed chooses among, when not the first kind_count
    # A workspace outage: from a moment in the first 30 s, every call is refused (401) or never
    # connects, for half the send deadline or past it; it spends no fault of the budget.
    outage: bool = False
    # The broker refuses this many publishes (Redis away for a moment), apart from ``faults``: the
    # rows are the next sweep's.
    publish_refusals: int = 0
    # Inboxes an administrator removed from the workspace before the run: the routes that name
    # them find no inbox (the configuration was not told).
    removed_inboxes: tuple[int, ...] = ()
    # The reminders' template is withdrawn from the registry (a redeploy) between the last
    # hand-over and 30 s after it: attempts still to send it fail invalid_for_channel.
    template_withdrawn: bool = False
    # Notifications share their patients (index modulo this): two reminders of one patient on one
    # route meet in one conversation, so a read of it lists both. Kinds 0-2 only (the others'
    # recipients are set up per notification).
    patients: int = 0
    batches: bool = False  # the host hands its notifications over in batches of one to three (notify_many)
    # The receiver records up to this many deliveries that arrived together in one group commit and
    # publishes them as one consumer task (dispatcher.outcomes), applied together (1: one at a time)
    receiver_group: int = 1
    traced: bool = False  # tracing on, spans kept in memory: every outcome applied marks its notification's trace
    store: str = "sqlite"  # "postgresql": the production store (tests/simulation/stores.py), its own statements
    profile: str = "stock"  # the workspace's face (sandbox/profiles.py): "contract" sends the status in its events
    # Settings a world changes from the example configuration's, each with its reason in WORLDS.
    settings_changes: tuple[tuple[str, float], ...] = ()
    route_windows: tuple[tuple[str, str], ...] = ()  # quiet hours: (route, its send_window in UTC), as a clinic sets them
    # The field's out-of-order status (issue 44): the workspace stores a late `sent` this long after
    # `delivered` (the sandbox's late_sent_after_s), drawn once per run between the two (seconds);
    # None: the sandbox's default (half of read_after_s). Kind 12's recipients regress and never read.
    late_sent_between_s: tuple[float, float] | None = None
    max_steps: int = 20_000
    horizon_s: float = 6 * 3600.0  # simulated time after which a run that has not ended fails liveness

    def __post_init__(self) -> None:
        # Shared patients only among the kinds whose recipient is their phone number alone: the
        # others set their patient up per notification, and the opt-out checks go by notification.
        if self.patients and (self.opt_outs or not set(self.kind_pool or self.kinds or range(self.kind_count)) <= {0, 1, 2}):
            raise ValueError("WorldSpec.patients: kinds 0-2 only, without opt-outs")


@dataclass
class Violation:
    invariant: str
    detail: str


@dataclass(frozen=True)
class Said:
    """An outcome word a run ended with (docs/tracking.md, "Outcome words"): who said it, and the
    message (for a delivery's run) whose record it speaks of."""
    who: str
    word: str
    message_id: int | None = None


@dataclass
class Outcome:
    trace: list[str]
    choices: list[int]
    violations: list[Violation]
    steps: int
    simulated_s: float
    faults_used: int
    settle_after_faults_s: float | None
    ends: dict[str, int]
    frontier: int | None = None  # a strict script's end: how many options its next choice has
    state_key: tuple[Any, ...] | None = None

    @property
    def ok(self) -> bool:
        return not self.violations


class World:
    def __init__(self, spec: WorldSpec, choices: Choices, *, settings: Callable[[str], Settings],
                 store: Callable[[World], tuple[Engine, Reads]], checks: Callable[[World], list[Violation]],
                 as_time: Callable[[object], Any], keep_trace: bool = True,
                 finals: Callable[[World], list[Violation]] | None = None) -> None:
        self.finals = finals  # the checks of a run that settled (what must hold once everything is done)
        self.as_time = as_time
        self.spec = spec
        self.choices = choices
        self.clock = SimClock()
        self.faults_left = spec.faults
        self.faults_used = 0
        self.last_fault_at = self.clock.now
        self.trace: list[str] = []
        self.keep_trace = keep_trace
        self.steps = 0
        self.open_transactions = 0
        self.running: Node | None = None
        self.main = greenlet.getcurrent()
        self.late_sent_after_s = self._plan_late_sent()
        self.workspace = SimWorkspace(self.clock.time, self._call_fault, profile=spec.profile,
                                      removed_inboxes=spec.removed_inboxes, late_sent_after_s=self.late_sent_after_s)
        self.settings = settings(self.workspace.webhook_secret)
        if spec.settings_changes:
            self.settings = self.settings.model_copy(update=dict(spec.settings_changes))
        if spec.route_windows:
            windows = dict(spec.route_windows)
            self.settings = self.settings.model_copy(update={"routes": {
                name: route.model_copy(update={"send_window": windows[name]}) if name in windows else route
                for name, route in self.settings.routes.items()}})
        self.broker = Broker(self.settings.broker_visibility_timeout_s)
        self.engine, self.raw = store(self)  # raw: plain SQL on the run's connection, for the checks
        self.sessions = session_factory(self.engine, announce=True)  # the host's callbacks are written (host_told)
        self.read_delivery = delivery_reader(self.settings)
        self.nodes = [Node(f"worker-{i + 1}", "worker") for i in range(spec.workers)]
        self.nodes += [Node("consumer-1", "consumer"), Node("beat", "beat"), Node("receiver", "receiver"),
                       Node("host", "host")]
        if spec.operator:
            self.nodes.append(Node("operator", "operator"))
        self.set_aside_seen: dict[str, float] = {}  # event ID -> when the operator saw it set aside
        self.failed_seen: dict[str, float] = {}  # event ID -> when its host saw it failed (host_retries)
        self.retries: dict[str, int] = {}  # event ID -> retries its host asked for (one_message allows a message each)
        # Notifications a crash left due without a send task (committed, then died before the publish):
        # the sweep's to find, not published_at_once's to judge, until a task for them is published.
        self.orphaned_by_crash: set[int] = set()
        self.due_after: dict[int, int] = {}  # scheduled notifications: seconds after their hand-over
        self.asked_send_at: dict[str, set[datetime]] = defaultdict(set)  # event ID -> every send_at its host asked for
        self.logged: list[logging.LogRecord] = []  # what our code logged since the last check
        self.sweeps_began = self.clock.utc()
        self.said: list[Said] = []  # the outcome words runs ended with since the last check
        self.spans: Any = None  # the in-memory span exporter of a traced world (WorldSpec.traced)
        self.claims_at_start: dict[str, dict[int, int]] = {}  # a send run's attempts' claims as it began
        # notification -> its attempts in flight (number -> claims) when a run sending it last crashed:
        # a claim that run made and left is not the claim of a twin run that finishes after it
        self.in_flight_at_crash: dict[int, dict[int, int]] = {}
        self.publish_refusals_left = spec.publish_refusals
        self.receiver_held_since: float | None = None  # a lone delivery waiting for others (receiver_group)
        self.next_sweep = self.clock.now + self.settings.sweep_interval_s
        self.hand_over_at: dict[int, float] = {}  # when the host hands each notification over (alone or in its batch)
        self.batch_of: dict[int, list[int]] = {}  # a batch's first notification -> the batch (WorldSpec.batches)
        self.host_events = self._plan_host()
        for host_event in self.host_events:
            if host_event.kind == "notify":
                for index in self.batch_of.get(host_event.index, [host_event.index]):
                    self.hand_over_at[index] = host_event.at
        self.never_confirmed: set[str] = set()  # event IDs whose recipient no channel ever confirms (kind 4)
        self.late_sent: set[str] = set()  # event IDs whose messages go delivered, then a late sent, no more (kind 12)
        self.window_closes_at: dict[int, float] = {}  # kinds 6, 7: when the recipient's service window closes
        self.create_runs: dict[float, datetime] = {}  # each createMessage call's moment -> when its run began
        self.provider_opted_out: set[int] = set()  # recipients who replied STOP to the SMS provider before the run (kinds 8, 9)
        self.outage = self._plan_outage()
        self.requests = [self._request(i) for i in range(spec.notifications)]
        self.config_version = 0  # how often the configuration was redeployed during the run
        if spec.template_withdrawn:  # between the last hand-over and 30 s after it
            withdraw_at = max(self.hand_over_at.values()) + self.choices.pick(31)
            self.host_events = sorted([*self.host_events, HostEvent(withdraw_at, "withdraw_template", 0)],
                                      key=lambda e: (e.at, e.index))
        self.handed_over: set[int] = set()
        self.webhook_copies: set[str] = set()
        self.opted_out_at: dict[int, float] = {}  # recipient index -> when the host asked for the opt-out
        self.stop_messages: dict[int, tuple[int, str]] = {}  # a STOP reply's message ID -> (recipient's index, channel)
        self.stops_recorded: set[tuple[int, str]] = set()  # STOP replies our receiver recorded
        self.cancels_asked: set[str] = set()  # event IDs the host asked to cancel
        self.checks = checks
        self.violations: list[Violation] = []
        self.memory: dict[str, Any] = {}  # what the invariants remember between steps
        self.frontier: int | None = None  # a strict script's end: the options of the choice it does not make
        self.state_key: tuple[Any, ...] | None = None

    # -- set-up -------------------------------------------------------------------------------
    def _began(self) -> None:
        self.open_transactions += 1

    def _ended(self) -> None:
        self.open_transactions = max(self.open_transactions - 1, 0)

    def _plan_host(self) -> list[HostEvent]:
        if self.spec.fixed_host:
            return [HostEvent(self.clock.now, "notify", index) for index in range(self.spec.notifications)]
        events = []
        for index in range(self.spec.notifications):
            events.append(HostEvent(self.clock.now + self.choices.pick(20), "notify", index))
        if self.spec.opt_outs and self.spec.opt_out_each:
            for index in range(self.spec.notifications):  # each recipient may opt out, one way or the other
                if self.choices.pick(2):
                    kind = ("suppress", "stop_reply")[self.choices.pick(2)]
                    events.append(HostEvent(self.clock.now + self.choices.pick(self.spec.opt_out_within_s), kind, index))
        elif self.spec.opt_outs and self.spec.notifications:
            chosen = self.choices.pick(self.spec.notifications + 1)
            if chosen:
                kind = ("suppress", "stop_reply")[self.choices.pick(2)]
                events.append(HostEvent(self.clock.now + self.choices.pick(self.spec.opt_out_within_s), kind, chosen - 1))
        if self.spec.cancels:  # drawn last, and only here: the other worlds' seeds keep their draws
            handed_over = {e.index: e.at for e in events if e.kind == "notify"}
            for index in range(self.spec.notifications):
                if self.choices.pick(2):  # within the hand-over's step, or up to cancel_within_s later
                    events.append(HostEvent(handed_over[index] + self.choices.pick(self.spec.cancel_within_s * 10) / 10,
                                            "cancel", index))
        if self.spec.scheduled:
            handed_over = {e.index: e.at for e in events if e.kind == "notify"}
            for index in range(self.spec.notifications):
                if self.choices.pick(2):  # due a while after its hand-over
                    self.due_after[index] = 1 + self.choices.pick(self.spec.scheduled_within_s)
                    if self.choices.pick(2):  # moved, before or after its time came
                        at = handed_over[index] + self.choices.pick(self.spec.scheduled_within_s + 10)
                        events.append(HostEvent(at, "reschedule", index))
        if self.spec.batches:  # drawn last: the other worlds' seeds keep their draws
            events = self._plan_batches(events)
        return sorted(events, key=lambda e: (e.at, e.index))  # stable: a hand-over before its cancel at the same moment

    def _plan_batches(self, events: list[HostEvent]) -> list[HostEvent]:
        """The host hands its events over in batches (``notify_many``, the HTTP batch): consecutive
        hand-overs join the first of theirs, one to three to a batch, at its time."""
        notify = sorted((e for e in events if e.kind == "notify"), key=lambda e: (e.at, e.index))
        joined: set[int] = set()
        while notify:
            size = 1 + self.choices.pick(3)
            group, notify = notify[:size], notify[size:]
            self.batch_of[group[0].index] = [e.index for e in group]
            joined.update(e.index for e in group[1:])
        return [e for e in events if not (e.kind == "notify" and e.index in joined)]

    def _plan_late_sent(self) -> float | None:
        """How long after `delivered` the workspace stores its late `sent` (the out-of-order world),
        drawn once per run in 10 ms steps; None: the sandbox's own default. Drawn first, and only
        in a world that asks, so the other worlds' seeds keep their draws."""
        if self.spec.late_sent_between_s is None:
            return None
        low, high = self.spec.late_sent_between_s
        steps = round((high - low) / LATE_SENT_STEP_S)
        return round(low + LATE_SENT_STEP_S * self.choices.pick(steps + 1), 3)

    def _plan_outage(self) -> Outage | None:
        """When the workspace is away, how, and for how long (the outage world)."""
        if not self.spec.outage:
            return None
        start = self.clock.now + self.choices.pick(30)
        fault = ("401", "connect error")[self.choices.pick(2)]
        deadline = self.settings.send_deadline_s
        length = (0.5 * deadline, deadline + 60.0, deadline + 600.0)[self.choices.pick(3)]
        return Outage(start, start + length, CALL_FAULTS.index(fault))

    def _request(self, index: int) -> NotificationRequest:
        # 0, 1: WhatsApp with SMS fallback; 2: SMS; 3: WhatsApp refused -> fallback; 4: never confirmed
        # on either channel (the delivery deadline decides); 5: reached by neither (the fallback fails
        # too); 6: WhatsApp, to a patient whose last message's service window closes within milliseconds of
        # the hand-over (free text may be refused with 131047: the approved template goes instead);
        # 7: as 6, to a patient the platform refuses (the template fails too: the fallback goes);
        # 8: WhatsApp refused -> SMS fallback to a number that replied STOP to the SMS provider before
        # we knew it (the provider refuses it with 21610); 9: SMS to such a number; 10: WhatsApp with
        # SMS fallback, to a patient whose contact the front desk made with an e-mail address only
        # (found by its identifier, it has no binding to either inbox: not_contactable on both routes);
        # 11: SMS (no fallback route) to a number it cannot reach: the message fails (30003), and so
        # does the notification, external_error, with no fallback decided; 12: WhatsApp with SMS
        # fallback, to a patient whose messages go delivered, then a late `sent` (the field's
        # out-of-order callbacks), and who never reads them: the workspace stores `sent` for good
        if self.spec.kinds:
            kind = self.spec.kinds[index]
        elif self.spec.kind_pool:
            kind = self.spec.kind_pool[self.choices.pick(len(self.spec.kind_pool))]
        else:
            kind = self.choices.pick(self.spec.kind_count)
        prefix = {3: "+1555010", 4: "+1555020", 5: UNREACHABLE_PREFIX, 7: "+1555010", 8: "+1555010",
                  11: UNREACHABLE_PREFIX, 12: LATE_SENT_PREFIX}.get(kind, "+1555100")
        patient = index % self.spec.patients if self.spec.patients else index  # whom it is for (shared_patients)
        phone = f"{prefix}{patient:04d}"
        event_id = f"ev-{index}"
        if kind == 4:
            self.never_confirmed.add(event_id)
        if kind == 12:
            self.late_sent.add(event_id)
        if kind in (8, 9):
            self.provider_opted_out.add(index)
            self.workspace.provider_opted_out(name="Patient", phone_number=phone, identifier=f"patient-{index}")
        if kind == 10:
            self.workspace.front_desk_contact(name="Patient", identifier=f"patient-{index}", email=f"patient-{index}@example.org")
        if kind in (6, 7):
            handed_over_at = self.hand_over_at[index]
            closes_in = handed_over_at - self.clock.now + WINDOW_CLOSE_STEP_S * self.choices.pick(WINDOW_CLOSE_STEPS)
            self.window_closes_at[index] = self.clock.now + closes_in
            self.workspace.customer_wrote(name="Patient", phone_number=phone, identifier=f"patient-{index}",
                                          age_s=self.workspace.service_window_s - closes_in)
        body: dict[str, Any] = {
            "event_id": event_id, "contact": {"identifier": f"patient-{patient}", "phone_number": phone, "name": "Patient"},
            "content": f"Reminder {event_id}: your appointment is tomorrow at 09:00",
        }
        if index in self.due_after:  # scheduled: due this long after its hand-over
            handed_over_at = self.hand_over_at[index]
            due = self.clock.utc() + timedelta(seconds=handed_over_at - self.clock.now + self.due_after[index])
            body["send_at"] = due.isoformat()
            self.asked_send_at[event_id].add(due)
        if kind in (2, 9, 11):
            body["route"] = "sms"
        else:
            body |= {"route": "reminders", "fallback_route": "sms",
                     "template": {"name": TEMPLATE_NAME, "language": "en", "category": "UTILITY",
                                  "params": {"1": "Patient", "2": "tomorrow 09:00"}}}
        return NotificationRequest.model_validate(body)

    def context(self, node: Node) -> SendContext:
        """The node's process memory, built again after a crash (caches, limiter, breaker), or as
        its next task starts after a redeploy (a new configuration)."""
        if node.context is not None and node.config_version != self.config_version:
            node.context = None
        if node.context is None:
            node.config_version = self.config_version
            api = WorkspaceClient.from_settings(self.settings, transport=self.workspace)
            settings = self.settings
            node.context = SendContext(
                settings=settings, api=api, sessions=self.sessions,
                limiter=LocalLimiter(limits_of(settings), clock=self.clock.time),
                inboxes=InboxDirectory(api.list_inboxes, clock=self.clock.time), plan=retry_plan_of(settings),
                rng=random.Random(f"{node.name}-{node.restarts}"),  # backoff jitter: fixed per process life
                clock=self.clock.utc, sleep=self._no_sleep, enqueuer=self.enqueuer,
                breaker=LocalBreaker(BreakerPlan(base_s=settings.breaker_base_s,
                                                 cap_s=max(settings.breaker_cap_s, settings.breaker_base_s)),
                                     clock=self.clock.time, rng=random.Random(3)))
        return node.context

    def _no_sleep(self, seconds: float) -> None:
        """A limiter's short wait: simulated time moves for everyone (nobody sleeps for real)."""
        self.clock.advance_to(self.clock.now + seconds)

    # -- the enqueuer the real code publishes through -----------------------------------------
    @property
    def enqueuer(self) -> World:
        return self

    def enqueue_send(self, notification_ids: Any, *, queue: str = "") -> list[int]:  # one queue in the world
        ids = list(notification_ids)
        self._marked_before_publish(ids)
        if self.publish_refusals_left and ids and self.choices.chance(PUBLISH_REFUSAL_RATE, 2):
            self.publish_refusals_left -= 1
            self.last_fault_at = self.clock.now
            # the broker is away: nothing is published, and the rows are the next sweep's, as after a crash
            self.note(f"broker: publish of send {', '.join(f'n{nid}' for nid in ids)} refused")
            self.orphaned_by_crash |= set(ids)
            return []
        for nid in ids:
            self.broker.publish(SEND, nid, self.clock.now)
            self.orphaned_by_crash.discard(nid)
        return ids

    def send_queue_depth(self) -> int:
        """Send tasks waiting in the queue, as kombu reads a Redis queue: not a countdown task its
        worker holds, nor a lost worker's task before the visibility timeout gives it back."""
        now = self.clock.now
        return sum(1 for task in self.broker.tasks if task.kind == SEND and task.holder is None and task.due <= now)

    def _marked_before_publish(self, ids: list[int]) -> None:
        """``marked_before_publish``: the run that publishes a send task marked its row enqueued
        first (the outbox's order: a mark written after the publish could undo the task's own wait,
        and the sweep would publish the row again meanwhile). A mark older than the run is
        another's: this run publishes what it never marked (a decision without a fallback that
        publishes anyway). A mark cleared meanwhile is a later move's, and no fault of this run."""
        node = self.running
        if node is None or node.began is None:
            return
        for nid in ids:
            row = self.raw.execute("SELECT enqueued_at, event_id FROM notifications WHERE id = ?", (nid,)).fetchone()
            if row is not None and row[0] is not None and as_time(row[0]) < node.began:
                self.violations.append(Violation("marked_before_publish", f"{node.name} published the send task of "
                                                 f"{row[1]} without marking its row in this run ({node.doing})"))

    def enqueue_outcome(self, delivery_row_id: int) -> None:
        self.broker.publish(OUTCOME, delivery_row_id, self.clock.now)

    # -- faults ---------------------------------------------------------------------------------
    def _fault(self, options: int, probability: float | None = None, *, free: bool = False) -> int:
        if self.faults_left <= 0 and not free:
            return 0
        value = self.choices.chance(self.spec.fault_rate if probability is None else probability, options)
        if value and not free:
            self.faults_left -= 1
            self.faults_used += 1
            self.last_fault_at = self.clock.now
        return value

    def _call_fault(self, operation: str) -> int:
        kinds = (*BASE_FAULTS, *(("422",) if self.spec.refusals else ()),
                 *(("answer unreadable",) if self.spec.unreadable_answers else ()))
        targeted = not self.spec.call_fault_operations or any(part in operation for part in self.spec.call_fault_operations)
        value = CALL_FAULTS.index(kinds[self._fault(len(kinds))]) if self.spec.call_faults and targeted else 0
        if self.outage is not None and self.outage.start <= self.clock.now < self.outage.end:
            value = self.outage.fault  # the workspace is away: every call meets it (no fault of the budget)
            self.last_fault_at = self.clock.now
        node = self.running
        task = node.task if node is not None and node.task is not None and node.task.kind == SEND else None
        if value and task is not None:  # what its notification's reasons may cite
            self.memory.setdefault("met", {}).setdefault(task.arg, set()).add(CALL_FAULTS[value])
        if operation.startswith("POST") and operation.endswith("/messages") and node is not None and node.began:
            self.create_runs[self.clock.now] = node.began  # the message it makes bears this moment
        if CALL_FAULTS[value] != "connect error" and task is not None:
            # every call a send task made that reached the workspace: the most provider tries it may count
            calls = self.memory.setdefault("send_calls", {})
            calls[task.arg] = calls.get(task.arg, 0) + 1
        self.note(f"{self.running.name if self.running else '?'} {operation}"
                  + (f" -> fault {CALL_FAULTS[value]}" if value else ""))
        return value

    def crash_point(self, site: str, in_transaction: bool) -> None:
        node = self.running
        if node is None:
            return
        if in_transaction or self.open_transactions:
            may_crash = self.spec.in_transaction_crashes and node.kind in self.spec.crash_nodes
            if may_crash and self._fault(2, self.spec.fault_rate / IN_TRANSACTION_RARITY):
                node.memory_loss = 1 + self.choices.pick(2)
                self.note(f"crash {node.name} ({'child' if node.memory_loss == 1 else 'worker'}) "
                          f"{site} during {node.doing}")
                raise SimCrash(site)
            return
        node.at = site
        verdict = self.main.switch()
        if verdict == "crash":
            raise SimCrash(site)

    def note(self, line: str) -> None:
        if self.keep_trace:
            self.trace.append(f"{self.clock.now - self.trace_start:9.2f}s {line}")

    # -- the scheduler --------------------------------------------------------------------------
    def run(self) -> Outcome:
        self.trace_start = self.clock.now
        previous = faults.install(self.crash_point)
        if self.spec.traced:
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

            self.spans = InMemorySpanExporter()
            tracing.configure(self.settings, service="simulation", exporter=self.spans)
        try:
            with simulated_time(self.clock), LogWatch(self.logged):
                try:
                    self._loop()
                except OutOfChoices as stop:  # a strict script ran out: the explorer branches here
                    self.frontier, self.state_key = stop.options, self.key()
        finally:
            faults.install(previous)
            if self.spec.traced:
                tracing.disable()
            for node in self.nodes:
                if node.run is not None and not node.run.dead:
                    node.run.throw(greenlet.GreenletExit)
            self.engine.dispose()
            self.raw.close()
        settle = self.memory.get("all_ended_at")
        return Outcome(self.trace, self.choices.made, self.violations, self.steps, self.clock.now - self.trace_start,
                       self.faults_used, None if settle is None else max(settle - self.last_fault_at, 0.0),
                       self.memory.get("ends", {}), self.frontier, self.state_key)

    def _loop(self) -> None:
        self.violations.extend(self.checks(self))
        while not self.violations:
            if self._finished():
                if self.finals is not None:
                    self.violations.extend(self.finals(self))
                return
            actions = self._enabled()
            if not actions:
                if not self._advance():
                    return
                continue
            self.steps += 1
            if self.steps > self.spec.max_steps or self.clock.now - self.trace_start > self.spec.horizon_s:
                self.violations.append(Violation("liveness", f"not settled after {self.steps} steps and "
                                                 f"{self.clock.now - self.trace_start:.0f} s of simulated time"))
                return
            _label, action = actions[self.choices.pick(len(actions))]
            action()
            self.violations.extend(self.checks(self))

    def _finished(self) -> bool:
        return (self.memory.get("all_ended_at") is not None and not self.broker.tasks
                and not any(node.busy for node in self.nodes) and not self.workspace.pending_deliveries()
                and self.workspace.loop.next_due() is None and len(self.handed_over) == len(self.requests)
                and not self._deliveries_unprocessed() and self._retry_due(float("inf")) is None)

    def _deliveries_unprocessed(self) -> bool:
        """A recorded webhook delivery the consumer has not finished: the tracking sweep publishes it again."""
        return self.raw.execute("SELECT 1 FROM webhook_deliveries WHERE processed_at IS NULL LIMIT 1").fetchone() is not None

    def _enabled(self) -> list[tuple[str, Callable[[], None]]]:
        now = self.clock.now
        actions: list[tuple[str, Callable[[], None]]] = []
        for node in self.nodes:
            if node.down_until is not None:
                if node.down_until <= now:
                    actions.append((f"restart {node.name}", lambda node=node: self._restart(node)))
                continue
            if node.busy:
                actions.append((f"step {node.name}", lambda node=node: self._resume(node)))
                continue
            if node.kind in ("worker", "consumer"):
                task = self.broker.ready((SEND,) if node.kind == "worker" else (OUTCOME, OUTCOMES), node.name, now)
                if task is not None:
                    actions.append((f"{node.name} takes {task}", lambda node=node, task=task: self._take(node, task)))
            elif node.kind == "beat" and self.next_sweep <= now:
                actions.append(("beat sweeps", lambda node=node: self._start(node, "sweeps", self._sweeps)))
            elif node.kind == "receiver" and self._receiver_takes(len(self.workspace.pending_deliveries()), now):
                actions.append(("webhook", lambda node=node: self._deliver(node)))
            elif node.kind == "host" and self.host_events and self.host_events[0].at <= now:
                actions.append(("host", lambda node=node: self._host(node)))
            elif node.kind == "host" and (event_id := self._retry_due(now)) is not None:
                actions.append(("host retries", lambda node=node, event_id=event_id: self._start(
                    node, f"retry {event_id}", lambda _node: self._host_retries(event_id))))
            elif node.kind == "operator" and (event_id := self._set_aside_due(now)) is not None:
                actions.append(("operator", lambda node=node, event_id=event_id: self._start(
                    node, f"retry {event_id}", lambda _node: self._operator_retries(event_id))))
        if self.workspace.loop.next_due() is not None and self.workspace.loop.next_due() <= now:  # type: ignore[operator]
            actions.append(("workspace timers", self.workspace.loop.run_due))
        return actions

    def _advance(self) -> bool:
        """Nothing can happen now: move time to the next thing due. False when nothing ever will."""
        idle_world = self.memory.get("all_ended_at") is not None and not self._deliveries_unprocessed()
        candidates = [self.broker.next_due(), self.workspace.loop.next_due(),
                      self.host_events[0].at if self.host_events else None]
        candidates += [node.down_until for node in self.nodes if node.down_until is not None]
        if self.receiver_held_since is not None:
            candidates.append(self.receiver_held_since + RECEIVER_HOLD_S)
        if not idle_world:  # once every notification has ended, beat's idle ticks are skipped
            candidates.append(self.next_sweep)
        candidates += [seen + OPERATOR_DELAY_S for seen in self.set_aside_seen.values()]
        candidates += [seen + HOST_RETRY_DELAY_S for event_id, seen in self.failed_seen.items()
                       if not self.retries.get(event_id)]
        due = min((c for c in candidates if c is not None and c > self.clock.now), default=None)
        if due is None:  # whatever is due now waits for a node that is busy or down: nothing ever frees it
            return False
        self.clock.advance_to(due)
        if idle_world and self.next_sweep < self.clock.now:
            self.next_sweep = self.clock.now
        return True

    # -- steps ----------------------------------------------------------------------------------
    def _start(self, node: Node, doing: str, work: Callable[[Node], None], task: Task | None = None) -> None:
        node.doing, node.task, node.at, node.points, node.began = doing, task, "", 0, self.clock.utc()
        # A run may die at one of its points, chosen now (one of the first crash_within_points, after crash_skip_points),
        # so crashes land anywhere in a run, not mostly at its first point.
        may_crash = node.kind in self.spec.crash_nodes and not self.spec.crash_per_point
        crash_at = self._fault(self.spec.crash_within_points + 1) if may_crash else 0
        node.crash_at = crash_at + self.spec.crash_skip_points if crash_at else 0

        def body() -> str:
            try:
                work(node)
            except SimCrash:
                return "crashed"
            return "done"

        node.run = greenlet(body, parent=self.main)
        self._switch(node, None)

    def _resume(self, node: Node) -> None:
        node.points += 1
        crash = 0
        if node.crash_at and node.points >= node.crash_at:  # the point this run was chosen to die at
            crash = 1 + self.choices.pick(2 if self.spec.lost_workers else 1)  # 1: the pool child dies, 2: the worker is lost
        elif self.spec.crash_per_point and node.kind in self.spec.crash_nodes:
            crash = self._fault(3 if self.spec.lost_workers else 2)
        if crash:
            self.note(f"crash {node.name} ({'child' if crash == 1 else 'worker'}) at {node.at} during {node.doing}")
            node.memory_loss = crash
            self._switch(node, "crash")
        else:
            self._switch(node, "go")

    def _switch(self, node: Node, verdict: str | None) -> None:
        self.running = node
        try:
            result = node.run.switch(verdict) if verdict is not None else node.run.switch()  # type: ignore[union-attr]
        finally:
            self.running = None
        if node.run is not None and node.run.dead:
            node.run = None
            if result == "crashed":
                self._crashed(node)
            else:
                finished, node.task, node.doing, node.at = node.task, None, "", ""
                if finished is not None:
                    self._left_to_the_sweep(node, finished)
                    if finished.kind == SEND:
                        self._left_in_flight(node, finished)
                elif node.kind == "beat":
                    self._left_by_the_sweep(node)

    def _crashed(self, node: Node) -> None:
        whole = node.memory_loss == 2 or node.kind not in ("worker", "consumer")
        if node.task is not None and node.task.kind == SEND:
            self.in_flight_at_crash[node.task.arg] = self._claims_of(node.task.arg, in_flight=True)
        if node.task is not None:
            if whole:
                self.broker.worker_lost(node.name, node.task, self.clock.now)
                self.note(f"broker: {node.task} comes back after the visibility timeout")
            else:
                self.broker.publish(node.task.kind, node.task.arg, self.clock.now)
                self.note(f"broker: {node.task} requeued (worker lost its child)")
        elif whole:
            self.broker.worker_lost(node.name, None, self.clock.now)
        node.task, node.doing, node.at, node.context = None, "", "", None
        node.down_until = self.clock.now + (1.0 if not whole else 10.0)
        self.orphaned_by_crash |= {nid for nid, _, _ in self._due_without_a_task()}

    def _left_in_flight(self, node: Node, finished: Task) -> None:
        """``record_matches``: a send run that ends without crashing leaves no attempt of its
        notification in flight (claimed for a createMessage call) unless another run holds it:
        an attempt stays in flight only while a call may be under way, so that a lease is never
        left for the next run to wait out after an answer came back."""
        claims_before = self.claims_at_start.pop(node.name, {})
        if any(other is not node and other.busy and other.task is not None and other.task.kind == SEND
               and other.task.arg == finished.arg for other in self.nodes):
            return
        left_by_a_crash = self.in_flight_at_crash.get(finished.arg, {})
        for number, claims in self._claims_of(finished.arg, in_flight=True).items():
            # claimed since this run began, and not by a twin run that crashed holding it (traced
            # seed 310): so by this run. A crashed run's claim waits out its lease.
            if claims != claims_before.get(number) and claims != left_by_a_crash.get(number):
                self.violations.append(Violation("record_matches", f"n{finished.arg}: attempt {number} left in flight "
                                                 f"after {node.name} finished {finished}"))

    def _claims_of(self, notification_id: int, *, in_flight: bool = False) -> dict[int, int]:
        return dict(self.raw.execute("SELECT number, claims FROM attempts WHERE notification_id = ?"
                                     + (" AND state = 'in_flight'" if in_flight else ""), (notification_id,)))

    def _left_to_the_sweep(self, node: Node, finished: Task) -> None:
        """``published_at_once``: a run that ends without crashing leaves its notification, when it
        is due to be sent (queued, sending or falling back; not waiting for a time), with a send task
        in the broker: a decision's fallback, a retry, a redelivery's work is published by the run
        that made it, not left for the sweep to find minutes later. Not judged while another run
        that may be publishing it is under way (a consumer's, the sweeps', the host's, or another
        send of it), nor for a row a crash left without its task (``orphaned_by_crash``). A failed
        current attempt is judged too: the run that finds its decision owed (the run that recorded
        the failure died before it) makes it."""
        if finished.kind == OUTCOMES:
            for row_id in finished.arg:
                self._left_to_the_sweep(node, Task(finished.due, finished.seq, OUTCOME, row_id))
            return
        notification_id = finished.arg if finished.kind == SEND else self._notification_of_delivery(finished.arg)
        if notification_id is None:
            return
        for other in self.nodes:
            if other is not node and other.busy and (
                    other.kind in ("consumer", "beat", "host", "operator")
                    or (other.task is not None and other.task.kind == SEND and other.task.arg == notification_id)):
                return
        if notification_id in self.orphaned_by_crash or self._came_due_untouched(notification_id, node):
            return
        for _, event_id, state in self._due_without_a_task(notification_id):
            self.violations.append(Violation("published_at_once", f"{event_id} is {state} with no send task after "
                                             f"{node.name} finished {finished}"))

    def _came_due_untouched(self, notification_id: int, node: Node) -> bool:
        """The row waited for a time (a retry's or a pause's due time, its schedule) that has come,
        and this run left it as it was: publishing it is the next sweep's, within
        ``sweep_interval_s`` (refusals seed 500: a paused workspace's due time passed while a
        consumer applied a report of the same notification)."""
        row = self.raw.execute("SELECT send_at, next_try_at, updated_at FROM notifications WHERE id = ?",
                               (notification_id,)).fetchone()
        if row is None or node.began is None:
            return False
        *times, updated_at = row
        waited = [as_time(moment) for moment in times if moment is not None]
        return bool(waited) and max(waited) <= self.clock.utc() and as_time(updated_at) < node.began

    def _left_by_the_sweep(self, node: Node) -> None:
        """``published_at_once`` for the sweeps: a sweep that ends without crashing leaves no row
        that was due to be sent when it began (a scheduled one whose time came, too) without a send
        task; what came due later is the next sweep's. Not judged for a row a crash or a refused
        publish left to a later sweep (the stale check waits ``stale_after_s`` for it) or one a send
        worker holds, nor while a consumer, the host or an operator is mid-run (it may be publishing it)."""
        held = set()
        for other in self.nodes:
            if other is node or not other.busy:
                continue
            if other.kind in ("consumer", "host", "operator"):
                return
            if other.task is not None and other.task.kind == SEND:
                held.add(other.task.arg)
        for nid, event_id, state in self._due_without_a_task(at=self.sweeps_began, scheduled=True):
            if nid not in held and nid not in self.orphaned_by_crash:
                self.violations.append(Violation("published_at_once", f"{event_id} is {state} with no send task "
                                                 f"after {node.name}'s sweeps"))

    def _due_without_a_task(self, notification_id: int | None = None, *, at: datetime | None = None,
                            scheduled: bool = False) -> list[tuple[int, str, str]]:
        """Notifications due to be sent (queued, sending or falling back, and ``scheduled`` ones
        too when asked; not set aside, waiting for no time past ``at``, by default now) with no
        send task in the broker: all of them, or the one asked about."""
        rows = self.raw.execute(
            "SELECT n.id, n.event_id, n.state, n.error_kind, n.send_at, n.next_try_at FROM notifications n"
            + (" WHERE n.id = ?" if notification_id is not None else ""),
            (notification_id,) if notification_id is not None else ()).fetchall()
        now = self.clock.utc() if at is None else at
        tasks = {task.arg for task in self.broker.tasks if task.kind == SEND}
        return [(nid, event_id, state) for nid, event_id, state, error_kind, *times in rows
                if (state in SENDABLE_STATES or (scheduled and state == "scheduled"))
                and error_kind not in SET_ASIDE_KINDS and nid not in tasks
                and not any(moment is not None and as_time(moment) > now for moment in times)]

    def _message_of_delivery(self, delivery_row_id: int) -> int | None:
        found = self.raw.execute("SELECT summary FROM webhook_deliveries WHERE id = ?", (delivery_row_id,)).fetchone()
        summary = found[0] if found else None  # JSON: text on SQLite, already read on PostgreSQL
        message_id = (json.loads(summary) if isinstance(summary, str) else summary or {}).get("message_id")
        return None if message_id is None else int(message_id)

    def _notification_of_delivery(self, delivery_row_id: int) -> int | None:
        message_id = self._message_of_delivery(delivery_row_id)
        if message_id is None:
            return None
        attempt = self.raw.execute("SELECT notification_id FROM attempts WHERE message_id = ?", (message_id,)).fetchone()
        return None if attempt is None else int(attempt[0])

    def _restart(self, node: Node) -> None:
        node.down_until, node.restarts = None, node.restarts + 1
        self.note(f"restart {node.name}")

    def _take(self, node: Node, task: Task) -> None:
        self.broker.take(task)
        if self.spec.duplicates and self._fault(2):  # the broker hands the same task out twice (a redelivery or a twin)
            self.broker.publish(task.kind, task.arg, self.clock.now)
            self.note(f"broker: {task} delivered twice")
        self.note(f"{node.name} runs {task}")
        work = self._send if task.kind == SEND else self._outcomes if task.kind == OUTCOMES else self._outcome
        if task.kind == SEND:
            self.claims_at_start[node.name] = self._claims_of(task.arg)
        self._start(node, str(task), lambda node: work(node, task), task)

    def _send(self, node: Node, task: Task) -> None:
        ctx = self.context(node)
        result = send_notification(task.arg, ctx)
        if result.outcome not in (SendOutcome.ACCEPTED, SendOutcome.ADOPTED) and not result.reason:
            # what the task returns is what Flower shows an operator: a run that did not send says why
            self.violations.append(Violation("says_why", f"send n{task.arg} ended {result.outcome.value} without a reason"))
        if result.outcome is SendOutcome.RETRY and not result.delay_s > 0:
            self.violations.append(Violation("says_why", f"send n{task.arg} retries without a delay"))
        if result.outcome is SendOutcome.RETRY and (result.paused or result.reason.startswith("quiet hours")):
            # the waits docs/notifications.md says a notification shows (auth, unreachable, quiet_hours);
            # our own limiter's and a conversation's short waits do not. Unless the wait is already
            # over: another run claimed the attempt since this one recorded it (that claim clears the
            # reason), or the notification moved on (retries seed 46: a twin delivery's run claimed
            # it between this run's pause and its end).
            shown = self.raw.execute(
                "SELECT n.error_kind, n.error_detail, n.state, a.state FROM notifications n LEFT JOIN attempts a "
                "ON a.notification_id = n.id AND a.number = n.current_attempt WHERE n.id = ?", (task.arg,)).fetchone()
            waiting = (shown is not None and shown[2] in SENDABLE_NOTIFICATION_STATES
                       and shown[3] != AttemptState.IN_FLIGHT)
            if shown is None or (waiting and not all(shown[:2])):
                self.violations.append(Violation("visibly_waiting", f"send n{task.arg} waits {result.delay_s:.0f} s "
                                                 f"({result.reason}) and the notification does not say why"))
        countdown = schedule_next_run(task.arg, result, ctx)
        self.note(f"{node.name} {task}: {result.outcome.value}{f' ({result.reason})' if result.reason else ''}")
        if countdown is not None:
            self.broker.publish(SEND, task.arg, self.clock.now + countdown, holder=node.name)
            self.orphaned_by_crash.discard(task.arg)

    def _outcome(self, node: Node, task: Task) -> None:
        ctx = self.context(node)
        try:
            outcome = process_delivery(task.arg, ctx, self)
        except Wait as wait:
            self.broker.publish(OUTCOME, task.arg, self.clock.now + max(wait.delay_s, 0.05), holder=node.name)
            return
        except ApiError as error:  # the workspace failed a read: as Celery, the task ends; the tracking sweep republishes the row
            self.note(f"{node.name} {task}: error {type(error).__name__}")
            return
        except Exception as error:  # anything else is a bug in the consumer (an incoming message once crashed it)
            self.violations.append(Violation("consumer_error", f"outcome d{task.arg} raised {type(error).__name__}"))
            return
        self.note(f"{node.name} {task}: {outcome}")
        self.said.append(Said("consumer", outcome, self._message_of_delivery(task.arg)))

    def _outcomes(self, node: Node, task: Task) -> None:
        """A consumer task of several deliveries (``dispatcher.outcomes``): as the worker's task, the
        ones told to wait run again after the wait, as one task."""
        ctx = self.context(node)
        try:
            result = process_deliveries(list(task.arg), ctx, self)
        except Exception as error:  # each delivery's own errors are kept inside; anything else is a bug
            self.violations.append(Violation("consumer_error", f"{task} raised {type(error).__name__}"))
            return
        if result.waiting:
            self.broker.publish(OUTCOMES, tuple(result.waiting), self.clock.now + max(result.wait_s, 0.05), holder=node.name)
        for row_id, word in result.ended.items():
            self.note(f"{node.name} {task}: d{row_id} {word}")
            self.said.append(Said("consumer", word, self._message_of_delivery(row_id)))

    def _sweeps(self, node: Node) -> None:
        self.next_sweep = self.clock.now + self.settings.sweep_interval_s
        self.sweeps_began = self.clock.utc()
        ctx = self.context(node)
        run_sweep(sessions=self.sessions, enqueuer=self, stale_after_s=self.settings.stale_after_s,
                  clock=self.clock.utc, budget_s=0.8 * self.settings.sweep_interval_s)
        report = tracking_sweep(ctx, self, self.enqueue_outcome)
        self.said += [Said("read-back", word) for word in report.reconciled]
        self.said += [Said("deadline", word) for word in report.deadline_decisions]
        counts = [*report.reconciled.values(), *report.deadline_decisions.values(), report.republished, report.repaired]
        if not all(isinstance(count, int) and count >= 0 for count in counts) or 0 in report.reconciled.values():
            self.violations.append(Violation("outcome_word", f"the sweep's report counts {report}"))  # what beat returns

    def _receiver_takes(self, pending: int, now: float) -> bool:
        """Whether the receiver takes deliveries now. In a group-commit world a lone delivery waits
        up to ``RECEIVER_HOLD_S`` for others (as requests queue behind a write under load), so that
        groups form; otherwise every delivery is taken as soon as it is there."""
        if not pending:
            return False
        if self.spec.receiver_group <= 1 or pending >= 2:
            return True
        if self.receiver_held_since is None:
            self.receiver_held_since = now
        return now >= self.receiver_held_since + RECEIVER_HOLD_S

    def _deliver(self, node: Node) -> None:
        self.receiver_held_since = None
        pending = self.workspace.pending_deliveries()
        index = self.choices.pick(min(len(pending), 2))  # the next, or the one after it (reordered)
        group = [self.workspace.take_delivery(index)]
        more = len(self.workspace.pending_deliveries())
        if self.spec.receiver_group > 1 and more:  # the receiver's group commit: those that arrived meanwhile
            group += [self.workspace.take_delivery(0) for _ in range(self.choices.pick(min(more, self.spec.receiver_group - 1) + 1))]
        arriving = [arrived for delivery in group if (arrived := self._arriving(delivery)) is not None]
        if not arriving:
            return

        def receive(node: Node) -> None:
            deliveries = [self.read_delivery(headers, body, self.clock.now) for headers, body, _ in arriving]
            row_ids = record_deliveries(self.sessions, deliveries)
            for _, _, stop_of in arriving:
                if stop_of is not None:  # recorded (now, or by an earlier copy): the consumer must honour it
                    self.stops_recorded.add(stop_of)
            # As the receiver publishes: at once, one task for one row, one task applying them
            # together for several.
            new = [row_id for row_id in row_ids if row_id is not None]
            if len(new) == 1:
                self.broker.publish(OUTCOME, new[0], self.clock.now)
            elif new:  # as CeleryOutcomePublisher.publish_many: one task applies them together
                self.broker.publish(OUTCOMES, tuple(new), self.clock.now)

        self._start(node, "webhook", receive)

    def _arriving(self, delivery: Any) -> tuple[dict[str, str], bytes, Any] | None:
        """A delivery as it reaches the receiver (its headers, its body and the STOP it carries),
        or None when it is dropped on the way; a delivery may also come twice."""
        copy = delivery.delivery_id in self.webhook_copies
        may_fault = self.spec.webhook_faults and not copy  # a copy made by a fault gets no fault of its own
        fault = self._fault(3, free=self.spec.webhook_faults_free) if may_fault else 0  # 1: dropped, 2: twice
        if fault == 1:
            self.note(f"webhook dropped: {self.workspace.describe(delivery)}")
            return None
        if fault == 2:
            self.webhook_copies.add(delivery.delivery_id)
            self.workspace.sandbox.webhooks._queue._queue.append(delivery)  # type: ignore[attr-defined]
        self.note(f"webhook {self.workspace.describe(delivery)}{' (twice)' if fault == 2 else ''}")
        headers = self.workspace.signed_headers(delivery)
        stop_of = self.stop_messages.get(json.loads(delivery.body).get("id")) if delivery.event == "message_created" else None
        return headers, delivery.body, stop_of

    def _host(self, node: Node) -> None:
        host_event = self.host_events.pop(0)

        def act(node: Node) -> None:
            try:
                self._host_act(host_event)
            except SimCrash:
                self.host_events.insert(0, HostEvent(self.clock.now + 5.0, host_event.kind, host_event.index))
                raise  # the host hands the same event over again after its own restart

        self._start(node, host_event.kind, act)

    def _host_act(self, host_event: HostEvent) -> None:
        request = self.requests[host_event.index]
        if host_event.kind == "notify" and len(self.batch_of.get(host_event.index, ())) > 1:
            self._hand_over_batch(self.batch_of[host_event.index])
        elif host_event.kind == "notify":
            try:
                record = accept(request, sessions=self.sessions, settings=self.settings, enqueuer=self, clock=self.clock.utc)
            except InvalidEvent as refused:  # a scheduled time its first, lost hand-over missed: now, then
                if self._refused_without_its_template(refused, host_event.index):
                    return
                if refused.field != "send_at":
                    raise
                request = self.requests[host_event.index] = request.model_copy(update={"send_at": None})
                try:
                    record = accept(request, sessions=self.sessions, settings=self.settings, enqueuer=self,
                                    clock=self.clock.utc)
                except InvalidEvent as again:
                    if self._refused_without_its_template(again, host_event.index):
                        return
                    raise
            self.handed_over.add(host_event.index)
            self.note(f"host handed over ev-{host_event.index} ({record.state})")
        elif host_event.kind == "suppress":
            # noted before the call: the host said no even if it dies right after the commit (seed 215 of refusals)
            self.opted_out_at.setdefault(host_event.index, self.clock.now)
            Recipients(self.sessions, self.settings).suppress({"phone_number": request.contact.phone_number})
            self.note(f"host suppressed the recipient of ev-{host_event.index}")
        elif host_event.kind == "cancel":
            self._cancel(host_event.index)
        elif host_event.kind == "reschedule":
            self._reschedule(host_event.index)
        elif host_event.kind == "withdraw_template":
            self._withdraw_template()
        else:
            self._stop_reply(host_event)

    def _refused_without_its_template(self, refused: InvalidEvent, index: int) -> bool:
        """Its first hand-over died before the commit, and the template was withdrawn since: the host
        is told the request is refused, and nothing of it is stored (it is answered, not lost)."""
        if refused.field != "template.name" or not self.config_version:
            return False
        self.handed_over.add(index)
        self.note(f"host handed over ev-{index}: refused ({refused.field})")
        return True

    def _withdraw_template(self) -> None:
        """The clinic's operator withdraws the reminders' template from the registry and redeploys:
        each process takes the new configuration as its next task starts."""
        kept = [t for t in self.settings.templates if t.name != TEMPLATE_NAME]
        self.settings = self.settings.model_copy(update={"templates": kept})
        self.config_version += 1
        self.note(f"operator withdraws the template {TEMPLATE_NAME} from the registry and redeploys")

    def _hand_over_batch(self, batch: list[int]) -> None:
        """The host hands a batch over (the real ``notify_many``); after a crash, the same batch again."""
        results = accept_many([self.requests[i] for i in batch], sessions=self.sessions, settings=self.settings,
                              enqueuer=self, clock=self.clock.utc)
        for index, item in zip(batch, results, strict=True):
            if item.outcome is ItemOutcome.REFUSED:  # every request of the worlds is valid, and each event comes once
                self.violations.append(Violation("host_told", f"the batch refused ev-{index}: {item.field} {item.problem}"))
                continue
            self.handed_over.add(index)
        self.note("host handed over a batch: " + ", ".join(f"ev-{i} ({r.outcome.value})"
                                                           for i, r in zip(batch, results, strict=True)))

    def _reschedule(self, index: int) -> None:
        """The host moves the notification to 1 to 20 s from now (the real operation)."""
        event_id = f"ev-{index}"
        send_at = self.clock.utc() + timedelta(seconds=1 + self.choices.pick(20))
        self.asked_send_at[event_id].add(send_at)  # asked, whether or not the answer comes back
        try:
            record = reschedule_notification(self.sessions, self.settings, event_id, send_at, clock=self.clock.utc)
        except (TooLate, UnknownNotification) as late:
            self.note(f"host reschedules {event_id}: {type(late).__name__}")
            return
        self.note(f"host reschedules {event_id}: {record.state} in {(send_at - self.clock.utc()).total_seconds():.0f} s")

    def _cancel(self, index: int) -> None:
        """The host cancels (the real operation, as ``Dispatcher.cancel`` runs it); a crash before its
        answer makes the host ask again after its restart, as a host's retry would."""
        event_id = f"ev-{index}"
        self.cancels_asked.add(event_id)
        try:
            record = cancel_notification(self.sessions, event_id, clock=self.clock.utc)
        except TooLate as late:
            self.note(f"host cancels {event_id}: too late ({late.state})")
            if late.state in CANCELLABLE_NOTIFICATION_STATES and not self._claimed(event_id):
                self.violations.append(Violation("host_told", f"the cancel of {event_id} answered too late "
                                                 "though no run had claimed its attempt"))
            return
        except UnknownNotification:  # its hand-over died with the host and comes again: nothing to cancel yet
            self.note(f"host cancels {event_id}: not handed over yet")
            return
        self.note(f"host cancels {event_id}: {record.state}")
        if record.state != "cancelled":  # the operation's contract: cancelled, or TooLate with the state it is in
            self.violations.append(Violation("host_told", f"the cancel of {event_id} answered {record.state} without TooLate"))

    def _claimed(self, event_id: str) -> bool:
        """Whether a run has claimed the notification's current attempt, or it is no longer queued:
        then a cancel is too late (its message may exist)."""
        row = self.raw.execute(
            "SELECT a.claims, a.state FROM notifications n LEFT JOIN attempts a ON a.notification_id = n.id "
            "AND a.number = n.current_attempt WHERE n.event_id = ?", (event_id,)).fetchone()
        return row is not None and row[0] is not None and (row[0] > 0 or row[1] != AttemptState.QUEUED)

    def _set_aside_due(self, now: float) -> str | None:
        """A notification set aside a minute ago or more (the operator looks, finds the cause, retries)."""
        set_aside = {event_id for (event_id,) in self.raw.execute(
            "SELECT event_id FROM notifications WHERE error_kind = ?", (CRASH_LOOP,))}
        for event_id in list(self.set_aside_seen):
            if event_id not in set_aside:
                del self.set_aside_seen[event_id]
        for event_id in sorted(set_aside):
            seen = self.set_aside_seen.setdefault(event_id, now)
            if seen + OPERATOR_DELAY_S <= now:
                return event_id
        return None

    def _retry_due(self, now: float) -> str | None:
        """A failed notification its host has not retried yet, failed HOST_RETRY_DELAY_S ago or more."""
        if not self.spec.host_retries:
            return None
        for (event_id,) in self.raw.execute("SELECT event_id FROM notifications WHERE state = 'failed' ORDER BY id"):
            if self.retries.get(event_id):
                continue
            seen = self.failed_seen.setdefault(event_id, self.clock.now)
            if seen + HOST_RETRY_DELAY_S <= now:
                return str(event_id)
        return None

    def _host_retries(self, event_id: str) -> None:
        """The host retries a failed notification with the request it handed over (the real
        ``retry`` operation, as ``Dispatcher.retry`` runs it). Noted before the call, as an opt-out
        is: a retry whose commit outlived the host still allows its message. A retry is a
        disturbance from outside, like a hand-over: liveness counts from it as from a fault."""
        self.retries[event_id] = self.retries.get(event_id, 0) + 1
        self.last_fault_at = self.clock.now
        request = self.requests[int(event_id.split("-")[1])]
        try:
            record = retry_notification(self.sessions, self.settings, self, event_id, request, clock=self.clock.utc)
        except StateConflict as conflict:  # no longer failed: the command says so, nothing changes
            self.note(f"host retries {event_id}: {conflict}")
            return
        self.note(f"host retries {event_id}: {record.state}")

    def _operator_retries(self, event_id: str) -> None:
        """``dispatcher retry EVENT_ID``: the real operation, as the command line runs it."""
        before = self.raw.execute("SELECT error_kind FROM notifications WHERE event_id = ?", (event_id,)).fetchone()
        try:
            set_aside.retry(self.sessions, event_id)
        except StateConflict:  # no longer set aside (a run finished it): the command says so, nothing changes
            self.note(f"operator: {event_id} is not set aside any more")
            return
        after = self.raw.execute("SELECT error_kind FROM notifications WHERE event_id = ?", (event_id,)).fetchone()
        if before is None or before[0] not in SET_ASIDE_KINDS or after is None or after[0] is not None:
            # the command said it ran the notification again: only one set aside is, and then it is not any more
            self.violations.append(Violation("host_told", f"operator's retry of {event_id} answered done, "
                                             f"though it was {before[0] if before else 'missing'}, now {after[0] if after else None}"))
        self.set_aside_seen.pop(event_id, None)
        self.note(f"operator retries {event_id}")

    def _stop_reply(self, host_event: HostEvent) -> None:
        """The recipient answers STOP in its SMS conversation, or else on the platform. Without one yet, the reply comes up to
        a minute later (when a message may have reached it); then the host suppresses instead."""
        index = host_event.index
        phone = self.requests[index].contact.phone_number
        store = self.workspace.sandbox.store
        for conversation in sorted(store.conversations.values(), key=lambda c: (c.inbox_id != 2, c.id)):  # SMS first
            contact = store.contacts.get(conversation.contact_id)
            if contact is not None and contact.phone_number == phone and conversation.inbox_id in STOP_CHANNELS:
                message_id = self.workspace.customer_replies(conversation.display_id, "STOP")
                self.stop_messages[message_id] = (index, STOP_CHANNELS[conversation.inbox_id])
                self.note(f"recipient of ev-{index} replies STOP in inbox {conversation.inbox_id}")
                return
        if host_event.waited < STOP_REPLY_WAITS:
            later = HostEvent(self.clock.now + 10.0, "stop_reply", index, host_event.waited + 1)
            self.host_events = sorted([*self.host_events, later], key=lambda e: (e.at, e.index))
            return
        self.opted_out_at.setdefault(index, self.clock.now)  # before the call, as above
        Recipients(self.sessions, self.settings).suppress({"phone_number": phone})
        self.note(f"host suppressed the recipient of ev-{index} (no conversation to reply in)")

    def key(self) -> tuple[Any, ...]:
        """What decides the run's future, without absolute times (times are kept relative to now, in
        whole seconds): the explorer visits each such state once."""
        now = self.clock.now

        def rel(value: Any) -> int | None:
            return None if value is None else round(self.as_time(value).timestamp() - now)

        rows = tuple(self.raw.execute(
            "SELECT state, fallback_decision, error_kind, current_attempt, message_id IS NULL FROM notifications ORDER BY id"))
        attempts = tuple((n, number, state, tries, claims, message, rel(lease), rel(read)) for n, number, state, tries, claims,
                         message, lease, read in self.raw.execute(
            "SELECT notification_id, number, state, tries, claims, message_id IS NULL, lease_until, next_read_at "
            "FROM attempts ORDER BY notification_id, number"))
        deliveries = tuple(self.raw.execute("SELECT processed_at IS NULL, tries FROM webhook_deliveries ORDER BY id"))
        broker = tuple(sorted((t.kind, t.arg, t.holder or "", round(t.due - now)) for t in self.broker.tasks))
        nodes = tuple((n.name, str(n.task) if n.task else n.doing, n.points, n.crash_at, n.at,
                       None if n.down_until is None else round(n.down_until - now), n.context is None) for n in self.nodes)
        messages = tuple((m.inbox_id, m.status, m.source_id is None) for m in self.workspace.outgoing())
        pending = tuple(self.workspace.describe(d) for d in self.workspace.pending_deliveries())
        return (rows, attempts, deliveries, broker, nodes, messages, pending, self.faults_left, len(self.host_events),
                round(self.next_sweep - now), self.workspace.loop.next_due() is None)
