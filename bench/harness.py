"""What every benchmark here needs: a percentile, the app on a loopback port, an API key.

Benchmarks import it as a sibling module (``from harness import ...``): a script's own
folder is first on ``sys.path``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from bot.apikeys import create_key
from bot.storage.db import create_engine, create_sessionmaker


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on a free 127.0.0.1 port; the runner (to clean up) and the base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def bench_key(db_url: str, name: str, owner: str | None = None) -> str:
    """A fresh API key (the secret) for the benchmark's client."""
    db = create_engine(db_url)
    try:
        async with create_sessionmaker(db)() as session, session.begin():
            return (await create_key(session, name=name, owner=owner)).key
    finally:
        await db.dispose()


LOOPS = ("asyncio", "uvloop")
"""``--loop``: the event loop a benchmark runs on (uvloop to compare, not a dependency)."""


def run_on(loop: str, main: Coroutine[Any, Any, None]) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


class LoopLag:
    """How late the service's event loop runs a callback, sampled every ``every_s``.

    A handler waits at least this long before it starts: when the acks are slow and
    this is not, the time goes elsewhere (a lock, the database); when it is, the loop
    has more work than it can do.
    """

    def __init__(self, every_s: float = 0.005) -> None:
        self._every_s = every_s
        self.samples_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self._every_s
            await asyncio.sleep(self._every_s)
            self.samples_ms.append((loop.time() - due) * 1000)

    def start(self) -> None:
        self.samples_ms = []
        self._task = asyncio.create_task(self._sample())

    def stop(self) -> list[float]:
        if self._task is not None:
            self._task.cancel()
        return self.samples_ms
