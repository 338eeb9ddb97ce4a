"""One connection kept checked out for short write transactions that run one at a time.

SQLite's accepts are such transactions: every message's ack waits for one, and this
process's writers take SQLite's one write lock in turn anyway (``bot.storage.db``). Each
took a pooled connection and gave it back, and that checkout and checkin (SQLAlchemy's
``Connection`` made and closed, the pool's bookkeeping, its reset, its events) cost a
third of the accept's own time (0.18-0.20 against 0.27-0.29 ms an accept, back to back). A
``KeptConnection`` keeps the connection between its transactions instead.

Only while they succeed: a transaction that raises (a duplicate delivery, a refusal, a
database error, a cancellation) gives the connection back to the pool, whose reset ends
whatever it left, and the next transaction checks one out afresh. Only for a file
database: an in-memory one has a single connection, which would then be shared.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


class KeptConnection:
    """Transactions one at a time on a connection kept between them (see the module)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None
        self._turn = asyncio.Lock()
        self._closed = False

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction on the kept connection, committed at the end of the block; rolled
        back if the block raises, and the connection given back to the pool."""
        async with self._turn:
            connection = self._connection
            if connection is None:
                connection = await self._engine.connect()
            self._connection = None
            try:
                async with connection.begin():
                    yield connection
            except BaseException:
                await connection.close()
                raise
            if self._closed or connection.invalidated:
                await connection.close()
            else:
                self._connection = connection

    async def close(self) -> None:
        """Give the connection back to the pool; transactions after this take a pooled one
        each (before the engine is disposed: a connection still checked out then would be
        left to the garbage collector)."""
        self._closed = True
        async with self._turn:
            connection, self._connection = self._connection, None
            if connection is not None:
                await connection.close()


def kept_for_accepts(engine: AsyncEngine) -> KeptConnection | None:
    """A ``KeptConnection`` for the accepts on ``engine``: SQLite's file databases only
    (PostgreSQL's accepts run side by side, each on a pooled connection of its own)."""
    url = engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return KeptConnection(engine)
