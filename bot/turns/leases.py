"""Several workers on one PostgreSQL: turn leases, taken and judged under row locks.

A worker may run a turn only while it holds the turn's *lease*
(``turns.lease_owner`` + ``turns.lease_expires_at``), renewed every
``lease_s / 3`` while it runs, on the database's clock. A worker that died
stops renewing: once its lease runs out the next worker to look at the
conversation takes the turn over (``bot.turns.claiming`` tells the whole
protocol; docs/scaling.md why row locks and not advisory locks).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage.db import create_statement_sessionmaker
from bot.storage.models import Turn, TurnStatus, as_utc
from bot.turns.cancellation import stop_requested
from bot.turns.claiming import (
    IS_OPEN,
    NOT_LIVE,
    OPEN_STATUSES,
    CancelHere,
    ClaimOutcome,
    Schedule,
    TurnClaims,
)
from bot.turns.resumption import MAX_TAKEOVERS, TAKEOVER_WINDOW_S
from bot.turns.wakeups import WakeupListener

log = structlog.get_logger(__name__)

FRESH_TURN_GRACE = dt.timedelta(seconds=2)
"""How long other workers' pollers leave a new, unleased turn to the worker that accepted it.

That worker schedules the turn the moment it is stored and streams its reply
to the reader it holds (SSE) token by token; a reader on one worker following
a turn run by another sees it only in the steps ``bot.turns.partials`` saves.
"""


async def database_now(session: AsyncSession) -> dt.datetime:
    """The database server's clock (PostgreSQL: the transaction's start time).

    Leases are written and judged by workers on different hosts: on one clock,
    theirs, a skewed host clock can neither steal a live lease nor keep a dead
    one alive.
    """
    now: dt.datetime = (await session.execute(select(func.now()))).scalar_one()
    return as_utc(now)


@dataclass(frozen=True)
class LeaseState:
    owner: str | None
    expires_at: dt.datetime | None

    def held_by_other(self, me: str, now: dt.datetime) -> bool:
        if self.owner is None or self.owner == me:
            return False
        return self.expires_at is not None and as_utc(self.expires_at) > now


def _can_take_over(turn: Turn, now: dt.datetime) -> bool:
    """A running turn whose worker died is continued here rather than failed."""
    return (
        turn.resumes < MAX_TAKEOVERS
        and as_utc(turn.created_at) > now - dt.timedelta(seconds=TAKEOVER_WINDOW_S)
        and turn.cancel_requested_at is None
        # Saved before replies kept their token ids: it cannot be continued token-exact.
        and (turn.reply_token_ids is not None or not turn.reply_text)
    )


def _head_id(conversation_id: str) -> Any:
    """The conversation's head turn's id (its lowest-numbered open turn), a subquery."""
    return (
        select(Turn.id)
        .where(Turn.conversation_id == conversation_id, IS_OPEN)
        .order_by(Turn.seq)
        .limit(1)
        .scalar_subquery()
    )


class LeasedClaims(TurnClaims):
    """Several workers on one PostgreSQL: leases taken and judged under row locks."""

    exclusive = False
    wakeups: WakeupListener | None = None

    def __init__(self, sessions: async_sessionmaker[AsyncSession], **options: Any) -> None:
        super().__init__(sessions, **options)
        self._statement_sessions = create_statement_sessionmaker(sessions.kw["bind"])
        """A free head's claim is one statement, outside a transaction."""

    async def _claim_head(self, conversation_id: str) -> tuple[ClaimOutcome, Turn | None]:
        claimed = await self._claim_free_head(conversation_id)
        if claimed is not None:
            return ClaimOutcome.CLAIMED, claimed
        head_id = _head_id(conversation_id)
        async with self._sessions() as session, session.begin():
            now = await database_now(session)
            # Lock the head only, and skip it when another worker is deciding on it:
            # a plain ``ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED`` would hand out
            # the turn *behind* a locked head and break the conversation's order.
            turn = (
                await session.scalars(
                    select(Turn).where(Turn.id == head_id).with_for_update(skip_locked=True)
                )
            ).one_or_none()
            if turn is None:
                return ClaimOutcome.IDLE, None
            if turn.status not in OPEN_STATUSES:
                return ClaimOutcome.RACED, None  # finished between the subquery and the lock
            lease = LeaseState(turn.lease_owner, turn.lease_expires_at)
            if lease.held_by_other(self.worker_id, now):
                return ClaimOutcome.BUSY, None
            if turn.status == TurnStatus.RUNNING:
                if lease.owner == self.worker_id:
                    if turn.id in self._live():
                        return ClaimOutcome.BUSY, None  # its renewal may just be late
                    self._mark_interrupted(turn, lease.owner, why=NOT_LIVE)
                    return ClaimOutcome.INTERRUPTED, turn
                if not _can_take_over(turn, now):
                    self._mark_interrupted(turn, lease.owner)
                    return ClaimOutcome.INTERRUPTED, turn
                # Its worker died: this one continues the reply (``TurnRunner.run``).
                log.info(
                    "turn_taken_over",
                    turn_id=turn.id,
                    conversation_id=turn.conversation_id,
                    previous_worker=lease.owner,
                    resumes=(turn.resumes or 0) + 1,
                )
                turn.resumes = (turn.resumes or 0) + 1
            turn.lease_owner = self.worker_id
            turn.lease_expires_at = now + self.lease
            return ClaimOutcome.CLAIMED, turn

    async def _claim_free_head(self, conversation_id: str) -> Turn | None:
        """The common claim in one statement outside a transaction: the head queued, its
        row not locked by another worker deciding on it, its lease free (none, this
        worker's, or run out). None otherwise, with nothing changed, for the full claim
        to tell apart (idle, busy, interrupted, raced).

        The full claim's transaction takes six round trips (the checkout's ping, BEGIN,
        the database's clock, the locked read, the lease's write, COMMIT) where this
        takes two, and every turn a worker starts claims first: on a busy host each trip
        is a wake-up of the database's process that the event loop, acknowledging
        messages, waits behind (docs/performance.md, "What costs what"). The lease is judged and
        written on the database's clock as there (``now()``).
        """
        locked_head = (
            select(Turn.id)
            .where(Turn.id == _head_id(conversation_id))
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        now = func.now()
        claim = (
            update(Turn)
            .where(
                Turn.id == locked_head,
                Turn.status == TurnStatus.QUEUED,
                (Turn.lease_owner.is_(None))
                | (Turn.lease_owner == self.worker_id)
                | (Turn.lease_expires_at.is_(None))
                | (Turn.lease_expires_at <= now),
            )
            .values(lease_owner=self.worker_id, lease_expires_at=now + self.lease)
            .returning(Turn)
            .execution_options(synchronize_session=False)
        )
        async with self._statement_sessions() as session:
            return (await session.scalars(claim)).one_or_none()

    def began_here(self, turn: Turn) -> None:
        """Never called: with several workers every turn is stored queued and claimed."""

    def _running_here(self) -> Any:
        return Turn.lease_owner == self.worker_id

    def _forget(self, turn: Turn) -> None:
        return None  # the lease lives in the row, and the row is final now

    async def _now(self, session: AsyncSession) -> dt.datetime:
        return await database_now(session)

    def _left_alone(
        self,
        status: str,
        owner: str | None,
        expires_at: dt.datetime | None,
        created_at: dt.datetime,
        now: dt.datetime,
    ) -> bool:
        if LeaseState(owner, expires_at).held_by_other(self.worker_id, now):
            return True
        if super()._left_alone(status, owner, expires_at, created_at, now):
            return True
        # A fresh queued turn nobody has claimed yet: its accepting worker is about to.
        return (
            status == TurnStatus.QUEUED
            and owner is None
            and as_utc(created_at) > now - FRESH_TURN_GRACE
        )

    async def recover(self) -> None:
        """Only our own earlier incarnation (same fixed worker id) is known dead; other
        workers' leases run out on their own."""
        async with self._sessions() as session, session.begin():
            await session.execute(
                update(Turn)
                .where(IS_OPEN, Turn.lease_owner == self.worker_id)
                .values(lease_owner=None, lease_expires_at=None)
            )

    async def _cancel_requests(self, session: AsyncSession) -> list[str]:
        """Turns running under this worker's lease that another worker was asked to stop."""
        return list(
            await session.scalars(
                select(Turn.id).where(
                    Turn.lease_owner == self.worker_id,
                    Turn.status == TurnStatus.RUNNING,
                    Turn.cancel_requested_at.is_not(None),
                )
            )
        )

    def start(self, schedule: Schedule, cancel: CancelHere) -> None:
        super().start(schedule, cancel)
        self._tasks.append(asyncio.create_task(self._renew_forever(), name="lease-renewal"))
        # Turns accepted by ingress-only processes are announced: claimed at once instead
        # of after FRESH_TURN_GRACE and a poll.
        self.wakeups = WakeupListener(
            self._sessions.kw["bind"], schedule, retry_s=self.poll_interval_s
        )
        self.wakeups.start()

    async def renew(self) -> int:
        """Push out the expiry of the leases this worker still uses; returns how many.

        A running turn keeps its lease only while its generation lives here: one
        whose final write failed must not keep other workers away for good.
        """
        live = self._live()
        in_use = Turn.status == TurnStatus.QUEUED
        if live:
            in_use = in_use | Turn.id.in_(live)
        async with self._sessions() as session, session.begin():
            result = await session.execute(
                update(Turn)
                .where(Turn.lease_owner == self.worker_id, IS_OPEN)
                .where(in_use)
                # On the database's clock (see ``database_now``).
                .values(lease_expires_at=func.now() + self.lease)
                .execution_options(synchronize_session=False)  # a new session
            )
        return int(getattr(result, "rowcount", 0) or 0)

    async def _renew_forever(self) -> None:
        interval = self.lease.total_seconds() / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew()
            except Exception as exc:  # the database blinked: the next round retries
                if stop_requested():
                    raise
                log.warning("lease_renewal_failed", error=f"{type(exc).__name__}: {exc}")

    async def close(self) -> None:
        """Stop renewing and polling; hand back queued turns claimed but not started."""
        claimed_here = bool(self._tasks)
        if self.wakeups is not None:
            await self.wakeups.close()
        await super().close()
        if not claimed_here:
            # Never started (an ingress-only process): it claimed nothing, and the leases
            # under its id, if a worker was given the same ``workers.id``, are that worker's.
            return
        try:
            async with self._sessions() as session, session.begin():
                await session.execute(
                    update(Turn)
                    .where(Turn.lease_owner == self.worker_id, Turn.status == TurnStatus.QUEUED)
                    .values(lease_owner=None, lease_expires_at=None)
                )
        except Exception as exc:
            log.warning("lease_release_failed", error=f"{type(exc).__name__}: {exc}")
