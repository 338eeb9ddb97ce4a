"""A single process's claims (SQLite), the guard that keeps it single, and the claims to use.

SQLite is single-process (``single_process_guard``): there, every lease left
by an earlier run is dead at start-up, and nothing of a reply is saved while
it streams, so interrupted turns fail at once. Several workers share
PostgreSQL with leases instead (``bot.turns.leases``); what both protocols
share, and the protocol as a whole, is ``bot.turns.claiming``.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from pathlib import Path
from typing import IO, Any

from sqlalchemy import String, bindparam, select, true, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage.db import is_sqlite
from bot.storage.models import Turn, TurnStatus, utcnow
from bot.turns.claiming import IS_OPEN, NOT_LIVE, ClaimOutcome, TurnClaims
from bot.turns.leases import LeasedClaims
from bot.turns.settings import WorkerSettings

_OPEN_HEAD = (
    select(Turn)
    .where(
        Turn.conversation_id == bindparam("conversation_id", type_=String),
        IS_OPEN,
    )
    .order_by(Turn.seq)
    .limit(1)
)
"""A conversation's oldest open turn; built once (it runs at every turn's start)."""


class LocalClaims(TurnClaims):
    """A single process (SQLite): no lease to write, the per-conversation task is the lock.

    Skipping the lease write matters there: SQLite serialises every writer,
    and an extra write per turn start queues behind accepts under load.
    """

    exclusive = True

    def __init__(self, sessions: async_sessionmaker[AsyncSession], **options: Any) -> None:
        super().__init__(sessions, **options)
        self._started_here: dict[str, str] = {}
        """Conversation -> the turn this process last handed out."""

    async def _claim_head(self, conversation_id: str) -> tuple[ClaimOutcome, Turn | None]:
        # A read: the runner starts the turn only if it is still queued (one locked
        # update), so a cancel landing in between is not lost.
        async with self._read_sessions() as session:
            turn = (
                await session.scalars(_OPEN_HEAD, {"conversation_id": conversation_id})
            ).one_or_none()
            if turn is None:
                return ClaimOutcome.IDLE, None
            if turn.status == TurnStatus.QUEUED:
                self._started_here[conversation_id] = turn.id
                return ClaimOutcome.CLAIMED, turn
            started_here = self._started_here.get(conversation_id) == turn.id
            if started_here and turn.id in self._live():
                return ClaimOutcome.BUSY, None
        # Running, but with no live generation here: a previous run died with it, or
        # its final write was refused for good.
        async with self._sessions() as session, session.begin():
            row = await session.get(Turn, turn.id)
            if row is None or row.status != TurnStatus.RUNNING:
                return ClaimOutcome.RACED, None
            self._mark_interrupted(row, row.lease_owner, why=NOT_LIVE if started_here else None)
        return ClaimOutcome.INTERRUPTED, row

    def began_here(self, turn: Turn) -> None:
        self._started_here[turn.conversation_id] = turn.id

    def _running_here(self) -> Any:
        return true()  # every turn is this process's

    def _forget(self, turn: Turn) -> None:
        self._started_here.pop(turn.conversation_id, None)

    async def _now(self, session: AsyncSession) -> dt.datetime:
        return utcnow()

    async def recover(self) -> None:
        """Every lease an earlier run left is dead: running turns are interrupted, queued free."""
        async with self._sessions() as session, session.begin():
            await session.execute(
                update(Turn).where(IS_OPEN).values(lease_owner=None, lease_expires_at=None)
            )


class AlreadyRunning(Exception):
    """Another process serves this SQLite database."""


def single_process_guard(database_url: str) -> IO[str] | None:
    """On SQLite, hold an exclusive lock file beside the database for the process's lifetime.

    SQLite has no row locks to share turns between processes, so a second
    ``botctl serve`` on the same file would run turns twice: refuse it. The
    OS drops the lock when the process dies, even on SIGKILL. Returns the open
    lock file (keep a reference), or None on PostgreSQL.
    """
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    path = Path(url.database).with_name(Path(url.database).name + ".serve.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.close()
        raise AlreadyRunning(
            f"another `botctl serve` already uses {url.database}: SQLite is single-process. "
            "Stop it, or use PostgreSQL (database.url = 'postgresql+asyncpg://...') "
            "to run several workers."
        ) from exc
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def build_claims(
    settings: WorkerSettings, database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> TurnClaims:
    """Claims for this process: exclusive on SQLite, shared leases on PostgreSQL."""
    kind: type[TurnClaims] = LocalClaims if is_sqlite(database_url) else LeasedClaims
    return kind(
        sessions,
        worker_id=settings.id,
        lease_s=settings.lease_s,
        poll_interval_s=settings.poll_interval_s,
        watchdog_grace_s=settings.watchdog_grace_s,
    )
