"""Exactly one process holds a bot's gateway connection.

Discord allows one gateway session per bot (per shard); with several
``botctl serve`` workers, each would otherwise connect and every mention would
be stored once and answered once, but received by all of them. So a worker
connects only while it holds the bot's gateway lease:

- PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) on a
  connection of its own, kept open while the gateway runs. The server drops the
  lock the moment that connection ends, which is also the moment the holding
  process dies (SIGKILL included: the kernel closes its socket), so another
  worker, polling every ``gateway_lease_poll_s``, takes over within one poll.
  The holder checks its connection at the same pace and disconnects from the
  gateway when it is gone (the lock went with it). The turns' leases are row
  leases instead (docs/scaling.md): they are many and short; this is one lock
  a bot, held for hours, where pinning one connection is the simple answer.
- SQLite: one process serves the database (``single_process_guard``): it holds
  every lease.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import struct

import structlog
from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import NullPool

from bot.storage.db import new_async_engine

log = structlog.get_logger(__name__)

_TRY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
_UNLOCK = text("SELECT pg_advisory_unlock(:key)")
_ALIVE = text("SELECT 1")


def lock_key(application_id: str) -> int:
    """The advisory lock's 64-bit key for one application's gateway."""
    digest = hashlib.sha256(f"discord-gateway:{application_id}".encode()).digest()
    key: int = struct.unpack(">q", digest[:8])[0]
    return key


class GatewayLease(abc.ABC):
    @abc.abstractmethod
    async def acquire(self) -> None:
        """Return once this process holds the lease (waiting while another one does)."""

    @abc.abstractmethod
    async def lost(self) -> None:
        """Return when the lease held is lost."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Give the lease back (no-op when not held)."""


class ProcessLease(GatewayLease):
    """SQLite: this process is the only one; the lease is always its own."""

    async def acquire(self) -> None:
        return None

    async def lost(self) -> None:
        await asyncio.Event().wait()

    async def release(self) -> None:
        return None


class AdvisoryLease(GatewayLease):
    """PostgreSQL: an advisory lock held on a connection of the lease's own."""

    def __init__(self, url: URL, application_id: str, *, poll_s: float) -> None:
        # Its own engine, no pool: the connection lives exactly as long as the lease.
        self._engine: AsyncEngine = new_async_engine(url, poolclass=NullPool)
        self._key = lock_key(application_id)
        self._poll_s = poll_s
        self._connection: AsyncConnection | None = None

    async def _try(self) -> bool:
        connection = await self._engine.connect()
        try:
            connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
            held = bool(await connection.scalar(_TRY_LOCK, {"key": self._key}))
        except BaseException:
            await connection.close()
            raise
        if held:
            self._connection = connection
        else:
            await connection.close()
        return held

    async def acquire(self) -> None:
        while True:
            try:
                if await self._try():
                    return
            except Exception as exc:  # the database is away: keep trying, like the claims
                log.warning("discord_gateway_lease_error", error=type(exc).__name__)
            await asyncio.sleep(self._poll_s)

    async def lost(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            connection = self._connection
            if connection is None:
                return
            try:
                await connection.scalar(_ALIVE)
            except Exception as exc:
                log.warning("discord_gateway_lease_lost", error=type(exc).__name__)
                await self._drop()
                return

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close()
            except Exception as exc:
                log.info("discord_gateway_lease_close_failed", error=type(exc).__name__)

    async def release(self) -> None:
        connection = self._connection
        if connection is not None:
            try:
                await connection.scalar(_UNLOCK, {"key": self._key})
            except Exception as exc:
                log.info("discord_gateway_lease_unlock_failed", error=type(exc).__name__)
        await self._drop()

    async def close(self) -> None:
        await self.release()
        await self._engine.dispose()
