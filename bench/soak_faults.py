"""Faults bench/soak.py injects from outside the workers: the engine's network, the database.

* ``EngineProxy``: a TCP proxy between the workers and the vLLM server. It
  cuts a connection after a random amount of the server's output (so a reply
  stops mid-stream, or a request dies before its first byte), and can take the
  engine away for a few seconds (every connection reset, new ones refused),
  which is what a killed and restarted vLLM server looks like from a worker,
  without the half minute a real restart costs on this machine.
* ``hold_lock``: another session holds the ``turns`` table (PostgreSQL) or the
  whole database (SQLite) for longer than a write may wait.
* ``cut_connections``: every connection the workers hold to PostgreSQL is
  terminated, as a database restart looks to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time

import asyncpg
from sqlalchemy.engine import make_url

READ_CHUNK = 16 * 1024


class EngineProxy:
    def __init__(self, upstream_port: int, *, cut_every_kb: float, seed: int) -> None:
        self._upstream_port = upstream_port
        self._mean_budget = cut_every_kb * 1024
        self._random = random.Random(seed)
        self._writers: set[asyncio.StreamWriter] = set()
        self._down_until = 0.0
        self._server: asyncio.Server | None = None
        self.port = 0
        self.cuts = 0
        self.outages = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()

    def outage(self, seconds: float) -> None:
        """The engine is gone for ``seconds``: live streams reset, new connections dropped."""
        self.outages += 1
        self._down_until = time.monotonic() + seconds
        for writer in list(self._writers):
            writer.transport.abort()

    def _budget(self) -> float:
        if self._mean_budget <= 0:
            return float("inf")
        return self._random.expovariate(1 / self._mean_budget)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._down_until:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        budget = self._budget()
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, None),
                self._pipe(up_reader, writer, budget),
            )
        finally:
            self._writers.difference_update((writer, up_writer))
            for side in (writer, up_writer):
                side.transport.abort()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, budget: float | None
    ) -> None:
        sent = 0
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(READ_CHUNK):
                if budget is not None and sent + len(data) > budget:
                    # Part of the chunk goes through, then the connection is reset.
                    writer.write(data[: max(0, int(budget) - sent)])
                    self.cuts += 1
                    writer.transport.abort()
                    return
                writer.write(data)
                sent += len(data)
                await writer.drain()
        writer.transport.abort()


async def hold_lock(db_url: str, hold_s: float) -> None:
    """Another session holds the turns table (PostgreSQL) or the database (SQLite)."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        await asyncio.to_thread(_hold_sqlite, url.database or "", hold_s)
        return
    connection = await asyncpg.connect(_plain_dsn(db_url))
    try:
        async with connection.transaction():
            await connection.execute("LOCK TABLE turns IN ACCESS EXCLUSIVE MODE")
            await asyncio.sleep(hold_s)
    finally:
        await connection.close()


def _hold_sqlite(path: str, hold_s: float) -> None:
    connection = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        connection.execute("BEGIN EXCLUSIVE")
        time.sleep(hold_s)
        connection.execute("ROLLBACK")
    finally:
        connection.close()


async def cut_connections(db_url: str) -> int:
    """Terminate every other connection to the database (PostgreSQL only); returns how many."""
    url = make_url(db_url)
    admin = await asyncpg.connect(_plain_dsn(db_url))
    try:
        cut = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            url.database,
        )
    finally:
        await admin.close()
    return int(cut or 0)


def _plain_dsn(db_url: str) -> str:
    url = make_url(db_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)
