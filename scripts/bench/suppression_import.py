"""How long `dispatcher suppressions import` takes for 100,000 entries (issue 19: under a minute).

    PYTHONPATH=scripts/bench .venv/bin/python scripts/bench/suppression_import.py [--rows 100000] [--postgres]

Writes a CSV of distinct E.164 numbers, imports it through the CLI's own code path into a fresh
SQLite file (or a fresh PostgreSQL database with --postgres, dropped after), and prints the time,
beside the time of writing the same number of rows with a plain executemany (the baseline, measured
in the same run), and the second import's time (everything already there: nothing added).
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from dispatcher.recipients.controls import Recipients
from dispatcher.settings import load_settings
from dispatcher.store.db import session_factory, shared_engine
from dispatcher.store.migrate import upgrade_database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--postgres", action="store_true", help="a fresh database on 127.0.0.1:5432 instead of SQLite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "opt-outs.csv"
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["phone_number", "channel"])
            for number in range(args.rows):
                writer.writerow([f"+1555{number:07d}", "sms"])
        database_url, drop = _database(folder, postgres=args.postgres)
        try:
            upgrade_database(database_url)
            settings = load_settings(api_url="http://127.0.0.1:9", api_token="bench", account_id=1,
                                     database_url=database_url, broker_url="memory://")
            engine = shared_engine(database_url)
            recipients = Recipients(session_factory(engine), settings)
            began = time.perf_counter()
            first = recipients.import_csv(str(path))
            import_s = time.perf_counter() - began
            began = time.perf_counter()
            again = recipients.import_csv(str(path))
            again_s = time.perf_counter() - began
            baseline_s = _baseline(engine, args.rows)
        finally:
            drop()
    print(json.dumps({"rows": first.rows, "added": first.added, "import_s": round(import_s, 2),
                      "again_added": again.added, "again_s": round(again_s, 2),
                      "plain_executemany_s": round(baseline_s, 2),
                      "ratio_to_plain_insert": round(import_s / baseline_s, 2) if baseline_s else None,
                      "store": "postgresql" if args.postgres else "sqlite"}))


def _database(folder: str, *, postgres: bool) -> tuple[str, object]:
    if not postgres:
        return f"sqlite:///{folder}/bench.sqlite", lambda: None
    name = f"nd_bench_import_{int(time.time())}"
    admin = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        shared_engine(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}").dispose()
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", drop


def _baseline(engine: sa.Engine, rows: int) -> float:
    """The same number of rows into a bare table of the same shape, one executemany: the floor."""
    table = sa.Table("bench_floor", sa.MetaData(), sa.Column("k", sa.String(64), primary_key=True),
                     sa.Column("c", sa.String(20)))
    table.create(engine)
    try:
        began = time.perf_counter()
        with engine.begin() as connection:
            connection.execute(table.insert(), [{"k": f"{n:064d}", "c": "sms"} for n in range(rows)])
        return time.perf_counter() - began
    finally:
        table.drop(engine)


if __name__ == "__main__":
    main()
