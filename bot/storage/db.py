"""The async database engine and session factory (SQLite by default, PostgreSQL in production)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

SQLITE_BUSY_TIMEOUT_MS = 5000


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets SSE readers run while a turn writes; foreign keys are off by default in SQLite.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL syncs at checkpoints, not at every commit: a commit stays atomic
    # and the database uncorrupted; a power cut may lose the last commits, a crash of
    # the process none. Every accept is a commit, so this is the ack's largest cost.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()
    # Let SQLAlchemy's "begin" event issue BEGIN itself (below) instead of the driver.
    dbapi_connection.isolation_level = None


def _on_sqlite_begin(connection: Any) -> None:
    # A deferred transaction that reads and then writes cannot wait for the write lock:
    # if another connection committed meanwhile, SQLite fails it at once with "database
    # is locked" (the busy timeout does not apply). Taking the lock at BEGIN makes every
    # transaction queue on busy_timeout instead. That serialises sessions, reads included;
    # SQLite is the single-process default and our transactions are short.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_engine(url: str, *, echo: bool = False) -> AsyncEngine:
    """Create the engine; for SQLite, create the database's folder and set its pragmas."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, echo=echo)
        event.listen(engine.sync_engine, "connect", _on_sqlite_connect)
        event.listen(engine.sync_engine, "begin", _on_sqlite_begin)
        return engine
    return create_async_engine(url, echo=echo, pool_pre_ping=True)


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
