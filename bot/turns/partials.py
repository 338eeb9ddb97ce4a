"""A running turn's reply so far, kept in its row for readers on other workers.

With several workers (PostgreSQL) the client reading a turn's stream may be
connected to a worker that is not running the turn: a reconnect that the load
balancer sent elsewhere, or a message that waited behind a turn another worker
was running. Such a reader polls the turn row (``bot.channels.api.routes``);
saving the reply so far every ``PARTIAL_REPLY_INTERVAL_S`` lets it stream in
steps of about that size instead of getting the whole reply at the end.

The write is fenced like every write of a running turn: it only lands while
the turn is running under this worker's lease. A single process (SQLite)
streams every reader from memory and does not need it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import structlog
from sqlalchemy import String, Text, bindparam, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage.db import create_statement_sessionmaker
from bot.storage.models import Turn, TurnStatus, table_of
from bot.turns.cancellation import stop_requested

log = structlog.get_logger(__name__)

PARTIAL_REPLY_INTERVAL_S = 0.5
MAX_SAVES_IN_FLIGHT = 3
"""Saves a worker runs at once, of all its turns. A turn whose interval comes while they
are all out skips it: its next save carries the whole reply so far (and is the one that
finds a lease lost to a takeover: later, under such load). Unbounded, the saves of
hundreds of turns generating at once (a real model under load on PostgreSQL) held pooled
connections 219 s in a 60 s run (bench/connection_waits.py) while accepts, starts and
final writes waited for one: background work may not take a worker's whole pool."""
SAVE_IN_FLIGHT_GRACE_S = 2.0
"""How long the end of a turn waits for a save already sent before cancelling it."""


class PartialReplies:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        worker_id: str,
        interval_s: float = PARTIAL_REPLY_INTERVAL_S,
        max_in_flight: int = MAX_SAVES_IN_FLIGHT,
    ) -> None:
        self._sessions = create_statement_sessionmaker(sessions.kw["bind"])
        """Each save is one statement, outside a transaction (``save``)."""
        self.worker_id = worker_id
        self.interval_s = interval_s
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        """Saves sent and not answered yet, of every turn of this worker."""

    @contextlib.asynccontextmanager
    async def saving(
        self,
        turn_id: str,
        reply_so_far: Callable[[], str],
        on_lost: Callable[[], object] | None = None,
    ) -> AsyncIterator[None]:
        """Save ``reply_so_far()`` every interval while the block runs (when it changed).

        ``on_lost`` is called once if a save finds the turn no longer ours to write.

        At the block's end a save already sent is let finish (up to
        ``SAVE_IN_FLIGHT_GRACE_S``), not cancelled: cancelling a statement in flight
        costs a cancel request on a connection of its own and the pooled connection
        (invalidated), and under load, when saves are slow, many turns would end so.
        """
        ended = asyncio.Event()
        task = asyncio.create_task(self._save_while_running(turn_id, reply_so_far, on_lost, ended))
        try:
            yield
        finally:
            ended.set()
            await asyncio.wait({task}, timeout=SAVE_IN_FLIGHT_GRACE_S)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _save_while_running(
        self,
        turn_id: str,
        reply_so_far: Callable[[], str],
        on_lost: Callable[[], object] | None,
        ended: asyncio.Event,
    ) -> None:
        saved = ""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await ended.wait()
            if ended.is_set():
                return  # the turn's final write stores the whole reply
            text = reply_so_far()
            if text == saved or self.in_flight >= self.max_in_flight:
                continue
            self.in_flight += 1
            try:
                if not await self.save(turn_id, text):
                    # No longer ours (taken over) or no longer running.
                    log.warning("turn_lease_lost", turn_id=turn_id)
                    if on_lost is not None:
                        on_lost()
                    return
            except Exception as exc:  # a database blink costs readers one step, not the turn
                if stop_requested():
                    raise
                log.warning("partial_reply_not_saved", error=f"{type(exc).__name__}: {exc}")
                continue
            finally:
                self.in_flight -= 1
            saved = text

    async def save(self, turn_id: str, text: str) -> bool:
        """Store ``text`` as the turn's reply so far; False when the turn is not ours to write.

        One statement outside a transaction (all or nothing on its own): the checkout's
        ping and the UPDATE, where a transaction takes two more round trips (BEGIN,
        COMMIT), and the saves of every turn generating run back to back under load.
        """
        async with self._sessions() as session:
            result = await session.execute(
                _SAVE, {"turn_id": turn_id, "worker_id": self.worker_id, "reply_text": text}
            )
        return int(getattr(result, "rowcount", 0) or 0) == 1


_TURNS = table_of(Turn)
_SAVE = (
    # The table, not the mapped class: an ORM-enabled UPDATE goes through the ORM's bulk
    # machinery for nothing here.
    update(_TURNS)
    .where(
        _TURNS.c.id == bindparam("turn_id", type_=String),
        _TURNS.c.status == TurnStatus.RUNNING,
        _TURNS.c.lease_owner == bindparam("worker_id", type_=String),
    )
    .values(reply_text=bindparam("reply_text", type_=Text))
)
"""The fenced save of a running turn's reply so far; built once."""
