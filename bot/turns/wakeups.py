"""Waking the workers that run turns when an ingress-only process accepts one.

An ingress-only process (``workers.run_turns = false``, PostgreSQL) stores a
message as a queued turn and answers; it never runs the turn. In the accept's
own transaction it announces the conversation with ``pg_notify``, which
PostgreSQL delivers at commit and drops on rollback, so a worker is never woken
for a turn that was not stored. Every worker that runs turns listens on one
connection of its own and schedules the announced conversation at once: the
claim under the turn's row lock decides which of them runs it.

The announcement only saves time: a worker whose listening connection is down
(it reconnects every ``poll_interval_s``) finds the turn by its poller, after
``FRESH_TURN_GRACE`` and at most one poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from bot.storage.db import create_probe_engine
from bot.turns.cancellation import stop_requested

log = structlog.get_logger(__name__)

CHANNEL = "bot_turn_accepted"
"""PostgreSQL's notification channel; the payload is the conversation id."""


async def announce(session: AsyncSession | AsyncConnection, conversation_id: str) -> None:
    """Wake the workers for ``conversation_id`` when ``session``'s transaction commits."""
    await session.execute(select(func.pg_notify(CHANNEL, conversation_id)))


class WakeupListener:
    """Listens for announced conversations on a connection of its own; reconnects.

    The connection is outside the request pool (held for the worker's lifetime, it
    would take one of the pool's connections from the turns and the acks for good).
    """

    def __init__(
        self, database: AsyncEngine, schedule: Callable[[str], None], *, retry_s: float
    ) -> None:
        self._engine = create_probe_engine(database.url.render_as_string(hide_password=False))
        self._schedule = schedule
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        """Set while the LISTEN is in place (tests wait for it)."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name="turn-wakeups")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._engine.dispose()

    def _on_notification(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        self._schedule(payload)

    async def _listen_forever(self) -> None:
        while True:
            try:
                await self._listen_once()
            except Exception as exc:
                if stop_requested():
                    raise
                log.warning("turn_wakeups_lost", error=f"{type(exc).__name__}: {exc}")
            self.listening.clear()
            await asyncio.sleep(self._retry_s)

    async def _listen_once(self) -> None:
        async with self._engine.connect() as connection:
            raw = await connection.get_raw_connection()
            driver = raw.driver_connection  # asyncpg's Connection
            assert driver is not None
            lost = asyncio.Event()
            driver.add_termination_listener(lambda _connection: lost.set())
            await driver.add_listener(CHANNEL, self._on_notification)
            self.listening.set()
            await lost.wait()  # closed with the connection when cancelled
            raise ConnectionError("the listening connection closed")
