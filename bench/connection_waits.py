"""Who waits for the database's connections, and who holds them, during a benchmark.

Runs another benchmark of this folder (``bench/load.py`` unless told) in this process and,
at its end, prints per task (its outermost coroutine: a request handler, a conversation's
worker, a turn's runner):

* ``pool``: checkouts of a pooled connection, how many waited over a millisecond, the
  time waited in all and the longest wait;
* ``hold``: checkouts again, from checkout to checkin: time held in all and the longest;
  ``yielded``: how many holds spanned an event-loop iteration (the task gave the loop away
  while it held the connection: every other task ran first);
* ``writer``: waits for this process's SQLite writer queue (``bot.storage.db``).

This is how the sixth session of issue 14 found sessions holding their connection across
SQLAlchemy's closing task. The counting patches private parts (``QueuePool._do_get``,
``asyncio.Handle._run``, ``bot.storage.db._acquire_within``) and costs the loop a little:
compare figures within one mode, not with a plain run.

Run:  .venv/bin/python bench/connection_waits.py --rates 50 --seconds 8
      .venv/bin/python bench/connection_waits.py --bench turns.py --conversations 16 --turns 3
"""

from __future__ import annotations

import asyncio
import asyncio.events
import atexit
import runpy
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

import bot.storage.db as db

HERE = Path(__file__).resolve().parent


@dataclass
class Tally:
    times_s: list[float] = field(default_factory=list)
    yielded: int = 0


tallies: defaultdict[tuple[str, str], Tally] = defaultdict(Tally)
loop_steps = 0


def task_name() -> str:
    """The outermost coroutine of the running task (``-`` outside one)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return "-"
    if task is None:
        return "-"
    return getattr(task.get_coro(), "__qualname__", "?")


def count_loop_steps() -> None:
    original = asyncio.events.Handle._run

    def run(self: asyncio.events.Handle) -> None:
        global loop_steps
        loop_steps += 1
        original(self)

    asyncio.events.Handle._run = run  # type: ignore[method-assign]


def count_pool_waits() -> None:
    original = QueuePool._do_get

    def do_get(self: QueuePool) -> Any:
        started = time.perf_counter()
        try:
            return original(self)
        finally:
            tallies["pool", task_name()].times_s.append(time.perf_counter() - started)

    QueuePool._do_get = do_get  # type: ignore[method-assign]


def count_writer_waits() -> None:
    original = db._acquire_within

    async def acquire_within(lock: asyncio.Lock, timeout_s: float) -> bool:
        started = time.perf_counter()
        try:
            return await original(lock, timeout_s)
        finally:
            tallies["writer", task_name()].times_s.append(time.perf_counter() - started)

    db._acquire_within = acquire_within


def count_holds() -> None:
    """Every engine made through ``bot.storage.db.create_engine`` from now on."""
    original = db.create_engine
    held: dict[int, tuple[float, str, int]] = {}

    def create_engine(url: str, **kwargs: Any) -> AsyncEngine:
        engine = original(url, **kwargs)
        pool = engine.sync_engine.pool

        def checked_out(_dbapi: Any, record: Any, _proxy: Any) -> None:
            held[id(record)] = (time.perf_counter(), task_name(), loop_steps)

        def checked_in(_dbapi: Any, record: Any) -> None:
            taken = held.pop(id(record), None)
            if taken is not None:
                tally = tallies["hold", taken[1]]
                tally.times_s.append(time.perf_counter() - taken[0])
                tally.yielded += loop_steps != taken[2]

        event.listen(pool, "checkout", checked_out)
        event.listen(pool, "checkin", checked_in)
        return engine

    # The modules that imported it by name before this ran.
    for module in list(sys.modules.values()):
        if getattr(module, "create_engine", None) is original and module is not db:
            module.create_engine = create_engine  # type: ignore[attr-defined]
    db.create_engine = create_engine


def report() -> None:
    print("# connection waits and holds, by task (ms)")
    print(f"{'what':7} {'task':40} {'count':>6} {'>1ms':>6} {'yielded':>7} {'sum':>9} {'max':>8}")
    ordered = sorted(tallies.items(), key=lambda item: -sum(item[1].times_s))
    for (kind, task), tally in ordered:
        times = tally.times_s
        over = sum(t > 0.001 for t in times)
        yielded = str(tally.yielded) if kind == "hold" else ""
        print(
            f"{kind:7} {task[:40]:40} {len(times):>6} {over:>6} {yielded:>7}"
            f" {1000 * sum(times):>9.0f} {1000 * max(times):>8.1f}"
        )


def main() -> None:
    arguments = sys.argv[1:]
    bench = "load.py"
    if arguments[:1] == ["--bench"]:
        bench, arguments = arguments[1], arguments[2:]
    count_loop_steps()
    count_pool_waits()
    count_writer_waits()
    count_holds()
    atexit.register(report)
    sys.path.insert(0, str(HERE))
    sys.argv = [str(HERE / bench), *arguments]
    runpy.run_path(str(HERE / bench), run_name="__main__")


if __name__ == "__main__":
    main()
