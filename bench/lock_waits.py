"""Which statements wait for PostgreSQL's locks while another benchmark runs.

Samples ``pg_stat_activity`` every few milliseconds, from a connection of its own, for
the given seconds, and prints per statement (its first 70 characters) the samples in
which a session ran it waiting for a lock (``wait_event_type = 'Lock'``), with the lock's
kind: ``transactionid`` is a row another transaction holds until it ends, ``object``
PostgreSQL's notify queue at commit. ``waiting / samples`` is the mean number of sessions
waiting on that statement at any moment.

Start it beside a benchmark that uses the same server, once its arrivals have begun:

    .venv/bin/python bench/load.py --rates 100 --seconds 8 \\
        --database postgresql+asyncpg://127.0.0.1/test --ingress-process --ingress-nice -10 &
    sleep 25; .venv/bin/python bench/lock_waits.py --seconds 10

The twelfth session of issue 14 found this way that every API turn's final write queues for
its key's one token counter row, and that an accept can wait behind such a final write on
its conversation's row.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter

import asyncpg

WAITING = (
    "SELECT wait_event, left(regexp_replace(query, '\\s+', ' ', 'g'), 70) AS statement"
    " FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
)


async def sample(
    dsn: str, seconds: float, interval_s: float
) -> tuple[int, Counter[tuple[str, str]]]:
    connection = await asyncpg.connect(dsn)
    waits: Counter[tuple[str, str]] = Counter()
    samples = 0
    try:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            # Outside a transaction: each statement reads a fresh view of the sessions.
            for row in await connection.fetch(WAITING):
                waits[(row["wait_event"], row["statement"])] += 1
            samples += 1
            await asyncio.sleep(interval_s)
    finally:
        await connection.close()
    return samples, waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://127.0.0.1/postgres")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval-ms", type=float, default=3.0)
    arguments = parser.parse_args()
    samples, waits = asyncio.run(
        sample(arguments.dsn, arguments.seconds, arguments.interval_ms / 1000)
    )
    print(f"# {samples} samples of pg_stat_activity in {arguments.seconds:g} s")
    print(f"{'waiting':>8} {'/ samples':>10}  {'lock':<14} statement")
    for (lock, statement), count in waits.most_common():
        print(f"{count:>8} {count / samples:>10.3f}  {lock:<14} {statement}")


if __name__ == "__main__":
    main()
