"""Per-send database cost with 10,000 and with 1,000,000 notification rows stored.

In one process, against the sandbox and a fresh PostgreSQL database: ``--contacts`` contacts
are warmed (contact, source_id and conversation stored), then the store is filled with SQL
(``INSERT ... SELECT generate_series``: notifications and their attempts, settled one to 29
days ago in the mix a stock workspace leaves, no payloads, as a busy store holds them within its
retention period) up to 10,000 rows, analysed, and ``--sends`` new
notifications for the known contacts are handed over (not timed) and sent by calling
``dispatcher.sending.send.send_notification`` in a loop (the warm path a worker runs). Then the store is
filled up to 1,000,000 rows and the same is measured again.

Per send (the median of ``--rounds`` rounds): wall time, and database time (time inside statement execution, commits and the
pool's liveness pings, measured at the driver boundary), with the statement count. The ratio
is 1M / 10k (target: at most 1.2). A cProfile of the warm path at 10k rows (``--profile``
sends) says where a send's time goes: it is the profile for the warm-path throughput figure.

    .venv/bin/python scripts/bench/db_cost.py --sends 1000 --sizes 10000 1000000

``scripts/bench/scale.py`` takes the same fill to 10,000,000 rows, with the webhook deliveries,
applied statuses and known contacts beside them, and measures the beat sweeps as well.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import time
from collections import defaultdict
from typing import Any

import common  # noqa: F401
from common import BENCH_SANDBOX, emit, environment, private_redis, reminder, settings_from, temp_database
from sqlalchemy.engine import make_url
from sqlalchemy.engine.interfaces import CacheStats

# The store as a busy deployment holds it within the retention period: settled notifications from
# one to 29 days old (retention deletes none of them), no payloads, in the mix a stock workspace
# leaves (by g % 100): 80 % read, 15 % delivered and never read, 3 % fell back to SMS after 131026
# and were delivered there, 2 % fell back and failed there too (two attempts each for those 5 %).
# ``:prefix`` names the rows (``fill-``); ``:min_age`` and ``:span`` (seconds) place their times.
FILL_SPAN_S = 28 * 86400
FILL_NOTIFICATIONS = """
INSERT INTO notifications (event_id, fingerprint, route, fallback_route, state, enqueued_at, created_at, updated_at,
                           channel, inbox_id, message_id, conversation_id, accepted_at, delivery_state, current_attempt,
                           fallback_decision, fallback_reason, fallback_decided_at, error_kind, error_detail)
SELECT :prefix || g, md5(g::text) || md5((g + 1)::text), 'reminders', 'sms',
       CASE WHEN b < 80 THEN 'read' WHEN b < 98 THEN 'delivered' ELSE 'failed' END, t, t, t + interval '1 hour',
       CASE WHEN b < 95 THEN 'messaging_platform' ELSE 'sms' END, CASE WHEN b < 95 THEN 1 ELSE 2 END,
       1000000000000 + g, 1 + g % 5000, t,
       CASE WHEN b < 80 THEN 'read' WHEN b < 98 THEN 'delivered' ELSE 'failed' END, CASE WHEN b < 95 THEN 1 ELSE 2 END,
       CASE WHEN b >= 95 THEN 'fallback' END, CASE WHEN b >= 95 THEN '131026 (#131026) Message undeliverable' END,
       CASE WHEN b >= 95 THEN t + interval '10 seconds' END,
       CASE WHEN b >= 98 THEN 'external_error' END, CASE WHEN b >= 98 THEN 'undeliverable' END
FROM (SELECT g, g % 100 AS b, now() - (:min_age + g % :span) * interval '1 second' AS t
      FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint)) AS g) AS s
"""
# Each notification's first attempt (failed on the platform where it fell back), then the fallback's.
# ``:contacts``: how many contacts the attempts name (contact IDs 1 .. contacts).
FILL_ATTEMPTS = """
INSERT INTO attempts (notification_id, number, route, channel, state, inbox_id, contact_id, conversation_id, message_id,
                      tries, accepted_at, status_at, created_at, updated_at, error_kind, error_detail)
SELECT id, 1, route, 'messaging_platform', CASE current_attempt WHEN 1 THEN state ELSE 'failed' END, 1,
       1 + id % :contacts, conversation_id,
       CASE current_attempt WHEN 1 THEN message_id ELSE message_id + 1000000000000 END, 1, accepted_at,
       accepted_at, created_at, updated_at, CASE current_attempt WHEN 1 THEN NULL ELSE 'external_error' END,
       CASE current_attempt WHEN 1 THEN NULL ELSE '131026 (#131026) Message undeliverable' END
FROM notifications WHERE id > :after AND event_id LIKE :prefix || '%'
"""
FILL_FALLBACK_ATTEMPTS = """
INSERT INTO attempts (notification_id, number, purpose, route, channel, state, inbox_id, contact_id, conversation_id,
                      message_id, tries, accepted_at, status_at, created_at, updated_at, error_kind, error_detail)
SELECT id, 2, 'fallback', 'sms', 'sms', state, 2, 1 + id % :contacts, conversation_id, message_id, 1, accepted_at,
       accepted_at, created_at, updated_at, error_kind, error_detail
FROM notifications WHERE id > :after AND event_id LIKE :prefix || '%' AND current_attempt = 2
"""
# With ``full``: what the receiver and the consumer left beside them. A stock workspace's four
# deliveries per message (created; the provider's id, delivered and read, without a status), all
# processed, with the summary the receiver stores (IDs and times only); the statuses applied
# (delivered, and read where read); the known contacts, first resolved one to 59 days ago.
FILL_DELIVERIES = """
INSERT INTO webhook_deliveries (delivery_id, event, summary, received_at, processed_at, outcome, tries, workspace,
                                message_id)
WITH n AS MATERIALIZED (  -- the summary's tail once per message, not once per delivery
    SELECT id, message_id, accepted_at, delivery_state,
           '", "message_id": ' || message_id || ', "status": null, "message_type": "outgoing", "private": false,'
           || ' "external_error": null, "conversation_display_id": ' || conversation_id || ', "inbox_id": ' || inbox_id
           || ', "account_id": 1, "contact_id": ' || (1 + id % :contacts) || ', "created_at": "'
           || to_char(accepted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
           || '", "reply_keyword": null, "sender_keys": []}' AS tail
    FROM notifications WHERE id > :after AND id <= :upto AND event_id LIKE :prefix || '%'
)
SELECT md5(n.id || '-' || k)::uuid::text, CASE k WHEN 0 THEN 'message_created' ELSE 'message_updated' END,
       CAST('{"event": "' || CASE k WHEN 0 THEN 'message_created' ELSE 'message_updated' END || n.tail AS json),
       n.accepted_at + k * interval '20 seconds', n.accepted_at + k * interval '20 seconds' + interval '2 seconds',
       CASE k WHEN 0 THEN 'ignored_no_status' WHEN 3 THEN 'applied_' || n.delivery_state ELSE 'settled' END, 1,
       'default', n.message_id
FROM n CROSS JOIN generate_series(0, 3) AS k
"""
FILL_APPLIED_STATUSES = """
INSERT INTO applied_statuses (workspace, message_id, status, applied_at)
SELECT 'default', n.message_id, s.status, n.accepted_at + interval '40 seconds'
FROM notifications AS n JOIN (VALUES ('delivered'), ('read')) AS s (status) ON s.status = 'delivered' OR n.state = 'read'
WHERE n.id > :after AND n.id <= :upto AND n.event_id LIKE :prefix || '%'
"""
FILL_KNOWN_CONTACTS = """
INSERT INTO known_contacts (instance, account_id, identity_key, contact_id, created_at)
SELECT 'default', :account_id, md5('fill-contact-' || c), c, now() - interval '1 day' - (c % 58) * interval '1 day'
FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint)) AS c
"""
DELIVERIES_PER_NOTIFICATION = 4
FULL_TABLES = ("webhook_deliveries", "applied_statuses", "known_contacts")
BULK_TABLES = ("notifications", "attempts", "webhook_deliveries")  # with ``full``, loaded as a bulk load is


class DriverClock:
    """Time spent at the driver boundary: statement execution, commits, pings."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import event

        self.seconds = 0.0
        self.statements = 0
        self.commits = 0
        self.compilations = 0  # statements SQLAlchemy compiled (a cache miss, or no cache key): 0 once warm
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        event.listen(engine, "handle_error", self._failed)
        dialect = engine.dialect
        for name in ("do_commit", "do_ping", "do_rollback"):
            setattr(dialect, name, self._timed(getattr(dialect, name), name))

    def _before(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        conn.info["bench_started"] = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        self.seconds += time.perf_counter() - conn.info.pop("bench_started")
        self.statements += 1
        if getattr(context, "compiled", None) is not None and context.cache_hit is not CacheStats.CACHE_HIT:
            self.compilations += 1

    def _failed(self, context: Any) -> None:
        """A statement that failed (a statement timeout) spent its time all the same."""
        connection = context.connection
        started = connection.info.pop("bench_started", None) if connection is not None else None
        if started is not None:
            self.seconds += time.perf_counter() - started
            self.statements += 1

    def _timed(self, method: Any, name: str) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                if name == "do_commit":
                    self.commits += 1
        return timed

    def read(self) -> tuple[float, int, int]:
        return self.seconds, self.statements, self.commits


def fill_to(engine: Any, rows: int, *, full: bool = False, contacts: int = 5000, account_id: int = 1,
            step: int = 250_000) -> dict[str, Any]:
    """Fill the store up to ``rows`` notifications with their attempts (naming ``contacts`` contacts)
    in chunks of ``step``, a transaction each, then VACUUM ANALYZE. With ``full``, also their webhook
    deliveries (each chunk's beside the next chunk's notifications, on a second connection), applied
    statuses and the known contacts up to ``contacts``, and the three large tables are loaded as
    a bulk load is: their secondary indexes and unique constraints dropped, then built again once
    (sorted, compact: as the insert-ordered keys of this fill grow them row by row, not as years of
    updates would). The fill runs on an engine of its own without the dispatcher's 30-second
    statement timeout; the time of each part is returned."""
    from concurrent.futures import Future, ThreadPoolExecutor

    import sqlalchemy as sa

    started = time.perf_counter()
    filler = sa.create_engine(engine.url, pool_size=3)
    timings: dict[str, float] = defaultdict(float)
    fill = {"prefix": "fill-", "contacts": contacts}

    def timed(connection: Any, name: str, sql: str, params: dict[str, Any], into: dict[str, float]) -> None:
        began = time.perf_counter()
        connection.execute(sa.text(sql), params)
        into[name] = into.get(name, 0.0) + time.perf_counter() - began

    def webhooks_of(after: int, upto: int) -> dict[str, float]:
        spent: dict[str, float] = {}
        with filler.begin() as connection:
            connection.execute(sa.text("SET LOCAL synchronous_commit TO OFF"))
            timed(connection, "webhook_deliveries", FILL_DELIVERIES, {**fill, "after": after, "upto": upto}, spent)
        return spent

    try:
        with filler.begin() as connection:
            count = int(connection.execute(sa.text("SELECT count(*) FROM notifications")).scalar_one())
            after = int(connection.execute(sa.text("SELECT coalesce(max(id), 0) FROM notifications")).scalar_one())
            low = int(connection.execute(sa.text(
                "SELECT count(*) FROM notifications WHERE event_id LIKE 'fill-%'")).scalar_one())
        missing = rows - count
        rebuild = [statement for table in BULK_TABLES for statement in _drop_secondary_indexes(filler, table)] \
            if full and missing > 0 else []
        side: list[Future[dict[str, float]]] = []
        with ThreadPoolExecutor(max_workers=1) as beside:
            for start in range(0, max(missing, 0), step):
                with filler.begin() as connection:
                    connection.execute(sa.text("SET LOCAL synchronous_commit TO OFF"))
                    timed(connection, "notifications", FILL_NOTIFICATIONS,
                          {"prefix": "fill-", "low": low + start, "high": low + min(start + step, missing) - 1,
                           "min_age": 86400, "span": FILL_SPAN_S}, timings)
                    timed(connection, "attempts", FILL_ATTEMPTS, {**fill, "after": after}, timings)
                    timed(connection, "attempts", FILL_FALLBACK_ATTEMPTS, {**fill, "after": after}, timings)
                    upto = int(connection.execute(sa.text("SELECT max(id) FROM notifications")).scalar_one())
                    if full:
                        timed(connection, "applied_statuses", FILL_APPLIED_STATUSES, {**fill, "after": after, "upto": upto},
                              timings)
                if full:
                    side.append(beside.submit(webhooks_of, after, upto))
                after = upto
            for done in side:
                for name, seconds in done.result().items():
                    timings[name + " (beside)"] += seconds
        with filler.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            if rebuild:
                began = time.perf_counter()
                connection.execute(sa.text("SET maintenance_work_mem TO '1GB'"))  # this session only
                for statement in rebuild:
                    connection.execute(sa.text(statement))
                timings["indexes built again"] += time.perf_counter() - began
            if full:
                known = int(connection.execute(sa.text(
                    "SELECT count(*) FROM known_contacts WHERE identity_key = md5('fill-contact-' || contact_id)")).scalar_one())
                if contacts > known:
                    timed(connection, "known_contacts", FILL_KNOWN_CONTACTS,
                          {"account_id": account_id, "low": known + 1, "high": contacts}, timings)
            tables = ["notifications", "attempts", "payloads", *(FULL_TABLES if full else ())]
            began = time.perf_counter()
            for table in tables:
                connection.execute(sa.text(f"VACUUM ANALYZE {table}"))
            timings["vacuum_analyze"] += time.perf_counter() - began
            stored = int(connection.execute(sa.text("SELECT count(*) FROM notifications")).scalar_one())
            size = connection.execute(sa.text("SELECT pg_size_pretty(pg_database_size(current_database()))")).scalar_one()
            table_rows = {table: int(connection.execute(sa.text(
                "SELECT reltuples::bigint FROM pg_class WHERE relname = :t"), {"t": table}).scalar_one()) for table in tables}
    finally:
        filler.dispose()
    return {"rows": stored, "added": max(missing, 0), "fill_seconds": round(time.perf_counter() - started, 1),
            "fill_seconds_by_part": {name: round(seconds, 1) for name, seconds in timings.items()},
            "table_rows": table_rows, "database_size": size}


def _drop_secondary_indexes(engine: Any, table: str) -> list[str]:
    """Drop ``table``'s unique constraints and indexes but its primary key; the statements that
    make them again, to run after a bulk load (one sorted build each, instead of row by row)."""
    import sqlalchemy as sa

    again: list[str] = []
    with engine.begin() as connection:
        for name, definition in connection.execute(sa.text(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = CAST(:t AS regclass)"
                " AND contype = 'u'"), {"t": table}).all():
            connection.execute(sa.text(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"'))
            again.append(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        for name, definition in connection.execute(sa.text(
                "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid"
                " WHERE x.indrelid = CAST(:t AS regclass) AND NOT x.indisprimary"), {"t": table}).all():
            connection.execute(sa.text(f'DROP INDEX "{name}"'))
            again.append(definition)
    return again


def hand_over(dispatcher: Any, prefix: str, count: int, contacts: int) -> list[int]:
    """Intake as a host does it; the IDs are those handed to the (list) enqueuer, in order."""
    start = len(dispatcher.enqueuer.sent)
    for n in range(count):
        dispatcher.notify(reminder(f"{prefix}-{n}", n % contacts))
    return dispatcher.enqueuer.sent[start:]


def send_all(context: Any, ids: list[int], clock: DriverClock | None) -> dict[str, Any]:
    from dispatcher.sending.send import Outcome, send_notification

    walls: list[float] = []
    outcomes: dict[str, int] = defaultdict(int)
    db_before = clock.read() if clock else (0.0, 0, 0)
    compiled_before = clock.compilations if clock else 0
    for notification_id in ids:
        started = time.perf_counter()
        result = send_notification(notification_id, context)
        walls.append(time.perf_counter() - started)
        outcomes[result.outcome.value] += 1
    db_seconds, statements, commits = (a - b for a, b in zip(clock.read(), db_before, strict=True)) if clock else (0.0, 0, 0)
    n = len(ids)
    return {
        "sends": n,
        "outcomes": dict(outcomes),
        "wall_ms_per_send": round(sum(walls) * 1000 / n, 3),
        "wall_ms_median": round(statistics.median(walls) * 1000, 3),
        "db_ms_per_send": round(db_seconds * 1000 / n, 3),
        "statements_per_send": round(statements / n, 2),
        "commits_per_send": round(commits / n, 2),
        "compilations_per_send": round(((clock.compilations if clock else 0) - compiled_before) / n, 3),
        "accepted": outcomes.get(Outcome.ACCEPTED.value, 0) == n,
    }


def _median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds (another process's burst spoils one round, not all)."""
    merged: dict[str, Any] = {"sends": sum(r["sends"] for r in rounds), "rounds": len(rounds),
                              "accepted": all(r["accepted"] for r in rounds)}
    for key in ("wall_ms_per_send", "wall_ms_median", "db_ms_per_send", "statements_per_send", "commits_per_send",
                "compilations_per_send"):
        merged[key] = round(statistics.median(r[key] for r in rounds), 3)
    merged["db_ms_per_send_rounds"] = [r["db_ms_per_send"] for r in rounds]
    return merged


def profile_sends(context: Any, ids: list[int]) -> dict[str, Any]:
    """cProfile of warm sends, own time grouped by library: where a send's CPU goes."""
    from dispatcher.sending.send import send_notification

    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for notification_id in ids:
        send_notification(notification_id, context)
    profiler.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler)
    groups: dict[str, float] = defaultdict(float)
    functions: list[tuple[float, str]] = []
    for (filename, _line, name), (_cc, _nc, own, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        groups[_group(filename, name)] += own
        if "/dispatcher/" in filename and "/site-packages/" not in filename:
            functions.append((cumulative, f"{filename.split('/dispatcher/')[-1]}:{name}"))
    total = sum(groups.values())
    top = sorted(functions, reverse=True)[:8]
    return {
        "sends": len(ids),
        "wall_ms_per_send_profiled": round(wall * 1000 / len(ids), 2),
        "own_time_share": {k: round(v / total, 3) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "dispatcher_cumulative_ms_per_send": {name: round(seconds * 1000 / len(ids), 2) for seconds, name in top},
    }


def _group(filename: str, name: str) -> str:
    if "sqlalchemy" in filename:
        return "SQLAlchemy"
    if "psycopg" in filename:
        return "psycopg (driver, incl. waiting for PostgreSQL)"
    if "httpx" in filename or "httpcore" in filename or "h11" in filename:
        return "httpx/httpcore"
    if "pydantic" in filename:
        return "pydantic"
    if "/dispatcher/" in filename:
        return "dispatcher"
    if filename == "~" and ("recv" in name or "send" in name or "poll" in name or "select" in name):
        return "socket I/O (waiting for the sandbox)"
    return "other (stdlib, builtins)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000], help="rows stored, ascending")
    parser.add_argument("--sends", type=int, default=1000, help="sends measured at each size")
    parser.add_argument("--contacts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5, help="the sends are timed in this many rounds; medians are reported")
    parser.add_argument("--profile", type=int, default=300, help="warm sends profiled at the first size (0: none)")
    parser.add_argument("--db-latency-ms", type=float, default=0.0,
                        help="the sends reach PostgreSQL through a proxy that holds each answer this long (a database on "
                             "another machine); round trips per send are counted on the wire then")
    args = parser.parse_args()

    from dispatcher.enqueue import ListEnqueuer
    from dispatcher.service import Dispatcher
    from dispatcher.store.migrate import upgrade_database
    from tests.support.dispatcher_setup import drive, send_context
    from tests.support.sandbox_process import running_sandbox
    from tests.support.tcp_proxy import tcp_proxy

    sizes: list[dict[str, Any]] = []
    profile: dict[str, Any] | None = None
    with contextlib.ExitStack() as stack, temp_database() as database_url, private_redis() as broker_url, \
            running_sandbox(BENCH_SANDBOX) as sandbox:
        upgrade_database(database_url)
        env = environment(api_url=sandbox.base_url, database_url=database_url, broker_url=broker_url)
        settings = settings_from(env)
        dispatcher = Dispatcher(settings, enqueuer=ListEnqueuer())
        engine = dispatcher.sessions.kw["bind"]  # the fill and the hand-over: direct
        direct = make_url(database_url)
        proxy = stack.enter_context(tcp_proxy(direct.host or "127.0.0.1", direct.port or 5432,
                                              answer_delay_s=args.db_latency_ms / 1000)) if args.db_latency_ms else None
        if proxy is not None:
            settings = settings.model_copy(update={"database_url": direct.set(host="127.0.0.1", port=proxy.port)
                                                   .render_as_string(hide_password=False)})
        with send_context(settings) as context:
            for contact in range(args.contacts):
                dispatcher.notify(reminder(f"warm-{contact}", contact))
                drive(context, dispatcher.enqueuer.sent[-1])
            clock = DriverClock(context.sessions.kw["bind"])  # the sends' own engine (through the proxy, if any)
            for number, rows in enumerate(sorted(args.sizes)):
                filled = fill_to(engine, rows)
                ids = hand_over(dispatcher, f"db{rows}", args.sends, args.contacts)
                send_all(context, ids[: min(50, len(ids))], clock)  # settle caches and connections; not counted
                rest = ids[min(50, len(ids)):]
                trips_before = proxy.round_trips if proxy is not None else 0
                rounds = [send_all(context, rest[i::args.rounds], clock) for i in range(args.rounds)]
                measured = _median_of(rounds)
                if proxy is not None:  # the pings and statements of the timed sends, as PostgreSQL saw them
                    measured["round_trips_per_send"] = round((proxy.round_trips - trips_before) / len(rest), 2)
                sizes.append({**filled, **measured})
                if number == 0 and args.profile:
                    profile = profile_sends(context, hand_over(dispatcher, "prof", args.profile, args.contacts))
    first, last = sizes[0], sizes[-1]
    ratio = round(last["db_ms_per_send"] / first["db_ms_per_send"], 3)
    emit({
        "benchmark": "per-send database cost by rows stored (in-process warm path)",
        "contacts": args.contacts,
        "sizes": sizes,
        "ratio_db": ratio,
        "ratio_wall": round(last["wall_ms_per_send"] / first["wall_ms_per_send"], 3),
        "target_ratio_max": 1.2,
        "met": ratio <= 1.2,
        "profile": profile,
    })
    return 0 if all(size["accepted"] for size in sizes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
