"""Per-send database cost with 10,000 and with 1,000,000 notification rows stored.

In one process, against the sandbox and a fresh PostgreSQL database: ``--contacts`` contacts
are warmed (contact, source_id and conversation stored), then the store is filled with SQL
(``INSERT ... SELECT generate_series``: notifications and their attempts, read long ago, no
payloads, as a busy store holds them) up to 10,000 rows, analysed, and ``--sends`` new
notifications for the known contacts are handed over (not timed) and sent by calling
``dispatcher.sending.send.send_notification`` in a loop (the warm path a worker runs). Then the store is
filled up to 1,000,000 rows and the same is measured again.

Per send (the median of ``--rounds`` rounds): wall time, and database time (time inside statement execution, commits and the
pool's liveness pings, measured at the driver boundary), with the statement count. The ratio
is 1M / 10k (target: at most 1.2). A cProfile of the warm path at 10k rows (``--profile``
sends) says where a send's time goes: it is the profile for the warm-path throughput figure.

    .venv/bin/python scripts/bench/db_cost.py --sends 1000 --sizes 10000 1000000
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections import defaultdict
from typing import Any

import common  # noqa: F401
from common import BENCH_SANDBOX, emit, environment, private_redis, reminder, settings_from, temp_database

FILL_NOTIFICATIONS = """
INSERT INTO notifications (event_id, fingerprint, route, fallback_route, state, enqueued_at, created_at, updated_at,
                           channel, inbox_id, message_id, conversation_id, accepted_at, delivery_state)
SELECT 'fill-' || g, md5(g::text) || md5((g + 1)::text), 'reminders', 'sms', 'read', t, t, t,
       'messaging_platform', 1, 1000000000000 + g, 1 + g % 5000, t, 'read'
FROM (SELECT g, now() - (g % 7776000) * interval '1 second' - interval '1 day' AS t
      FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint)) AS g) AS s
"""
FILL_ATTEMPTS = """
INSERT INTO attempts (notification_id, number, route, channel, state, inbox_id, contact_id, conversation_id, message_id,
                      tries, accepted_at, status_at, created_at, updated_at)
SELECT id, 1, route, channel, 'read', 1, 1 + id % 5000, conversation_id, message_id, 1, accepted_at, accepted_at,
       created_at, updated_at
FROM notifications WHERE id > :after AND event_id LIKE 'fill-%'
"""


class DriverClock:
    """Time spent at the driver boundary: statement execution, commits, pings."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import event

        self.seconds = 0.0
        self.statements = 0
        self.commits = 0
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        dialect = engine.dialect
        for name in ("do_commit", "do_ping", "do_rollback"):
            setattr(dialect, name, self._timed(getattr(dialect, name), name))

    def _before(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        conn.info["bench_started"] = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        self.seconds += time.perf_counter() - conn.info.pop("bench_started")
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


def fill_to(engine: Any, rows: int) -> dict[str, Any]:
    import sqlalchemy as sa

    started = time.perf_counter()
    with engine.begin() as connection:
        count = int(connection.execute(sa.text("SELECT count(*) FROM notifications")).scalar_one())
        after = int(connection.execute(sa.text("SELECT coalesce(max(id), 0) FROM notifications")).scalar_one())
        low = int(connection.execute(sa.text(
            "SELECT count(*) FROM notifications WHERE event_id LIKE 'fill-%'")).scalar_one())
    missing = rows - count
    step = 250_000
    for start in range(0, max(missing, 0), step):
        with engine.begin() as connection:
            connection.execute(sa.text(FILL_NOTIFICATIONS), {"low": low + start, "high": low + min(start + step, missing) - 1})
            connection.execute(sa.text(FILL_ATTEMPTS), {"after": after})
            after = int(connection.execute(sa.text("SELECT max(id) FROM notifications")).scalar_one())
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(sa.text("VACUUM ANALYZE notifications"))
        connection.execute(sa.text("VACUUM ANALYZE attempts"))
        connection.execute(sa.text("VACUUM ANALYZE payloads"))
        stored = int(connection.execute(sa.text("SELECT count(*) FROM notifications")).scalar_one())
        size = connection.execute(sa.text("SELECT pg_size_pretty(pg_database_size(current_database()))")).scalar_one()
    return {"rows": stored, "added": max(missing, 0), "fill_seconds": round(time.perf_counter() - started, 1),
            "database_size": size}


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
        "accepted": outcomes.get(Outcome.ACCEPTED.value, 0) == n,
    }


def _median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds (another process's burst spoils one round, not all)."""
    merged: dict[str, Any] = {"sends": sum(r["sends"] for r in rounds), "rounds": len(rounds),
                              "accepted": all(r["accepted"] for r in rounds)}
    for key in ("wall_ms_per_send", "wall_ms_median", "db_ms_per_send", "statements_per_send", "commits_per_send"):
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
    args = parser.parse_args()

    from dispatcher.enqueue import ListEnqueuer
    from dispatcher.service import Dispatcher
    from dispatcher.store.migrate import upgrade_database
    from tests.support.dispatcher_setup import drive, send_context
    from tests.support.sandbox_process import running_sandbox

    sizes: list[dict[str, Any]] = []
    profile: dict[str, Any] | None = None
    with temp_database() as database_url, private_redis() as broker_url, running_sandbox(BENCH_SANDBOX) as sandbox:
        upgrade_database(database_url)
        env = environment(api_url=sandbox.base_url, database_url=database_url, broker_url=broker_url)
        settings = settings_from(env)
        dispatcher = Dispatcher(settings, enqueuer=ListEnqueuer())
        engine = dispatcher.sessions.kw["bind"]
        with send_context(settings) as context:
            for contact in range(args.contacts):
                dispatcher.notify(reminder(f"warm-{contact}", contact))
                drive(context, dispatcher.enqueuer.sent[-1])
            clock = DriverClock(engine)
            for number, rows in enumerate(sorted(args.sizes)):
                filled = fill_to(engine, rows)
                ids = hand_over(dispatcher, f"db{rows}", args.sends, args.contacts)
                send_all(context, ids[: min(50, len(ids))], clock)  # settle caches and connections; not counted
                rest = ids[min(50, len(ids)):]
                rounds = [send_all(context, rest[i::args.rounds], clock) for i in range(args.rounds)]
                sizes.append({**filled, **_median_of(rounds)})
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
