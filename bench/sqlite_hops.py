"""Benchmark: a SQLite write transaction through aiosqlite's own SQLAlchemy adapter vs
the one-trip adapter (bot/storage/sqlite_driver.py), with N concurrent writers.

A transaction is BEGIN IMMEDIATE, 3 statements (INSERT, UPDATE ... RETURNING, SELECT),
COMMIT, through bot.storage.db.create_engine (writer queue and pragmas included). With
N writers they queue for the one write lock, so the time per transaction is about the
time a writer holds it. Prints per adapter and N: transactions per second, the mean
time each held the lock (elapsed / transactions) and the p50/p99 of a transaction's
latency (queueing included). Variants alternate, repeated --rounds times.

Run:  .venv/bin/python bench/sqlite_hops.py --writers 1,4,16 --transactions 400
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

from sqlalchemy import text

from bot.storage import db


async def _one_variant(url: str, writers: int, transactions: int) -> tuple[float, list[float]]:
    engine = db.create_engine(url)
    async with engine.begin() as conn:
        await conn.execute(text("DROP TABLE IF EXISTS t"))
        await conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER)"))
    latencies: list[float] = []
    per_writer = transactions // writers

    async def writer(w: int) -> None:
        for i in range(per_writer):
            started = time.perf_counter()
            async with engine.begin() as conn:
                await conn.execute(
                    text("INSERT INTO t (id, n) VALUES (:id, 0)"), {"id": w * per_writer + i}
                )
                await conn.execute(
                    text("UPDATE t SET n = n + 1 WHERE id = :id RETURNING n"),
                    {"id": w * per_writer + i},
                )
                await conn.execute(text("SELECT count(*) FROM t"))
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed = time.perf_counter() - started
    await engine.dispose()
    return elapsed, latencies


def _run(url: str, one_trip: bool, writers: int, transactions: int) -> tuple[float, list[float]]:
    if one_trip:
        return asyncio.run(_one_variant(url, writers, transactions))
    # aiosqlite's own adapter: create_engine then passes no DBAPI module of its own.
    with mock.patch.object(db, "OneTripDBAPI", lambda: None):
        return asyncio.run(_one_variant(url, writers, transactions))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--writers", default="1,4,16", help="concurrent writers, comma-separated")
    parser.add_argument("--transactions", type=int, default=400, help="per run")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        url = f"sqlite+aiosqlite:///{Path(workdir) / 'hops.db'}"
        print("adapter   writers  tx/s   hold_ms  p50_ms  p99_ms")
        for writers in (int(w) for w in args.writers.split(",")):
            for _ in range(args.rounds):
                for one_trip in (False, True):
                    elapsed, lat = _run(url, one_trip, writers, args.transactions)
                    lat.sort()
                    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
                    print(
                        f"{'one-trip' if one_trip else 'aiosqlite':<9} {writers:>7}"
                        f"  {len(lat) / elapsed:>5.0f}  {elapsed * 1000 / len(lat):>7.2f}"
                        f"  {statistics.median(lat):>6.2f}  {p99:>6.2f}"
                    )


if __name__ == "__main__":
    main()
