"""Which worker runs which turn: leases on turn rows, claimed under PostgreSQL row locks.

Several ``botctl serve`` processes share one PostgreSQL. A worker may run a
turn only while it holds the turn's *lease* (``turns.lease_owner`` +
``turns.lease_expires_at``), renewed every ``lease_s / 3`` while it runs.
Leases are taken and judged only while holding the turn row's lock
(``SELECT ... FOR UPDATE SKIP LOCKED``), so two workers never both decide
they own a turn. See docs/scaling.md for why row locks and not advisory locks.

Order within a conversation: only the conversation's *head* (its lowest-seq
turn that is not done or failed) can be claimed. While the head runs on one
worker, the turns behind it wait, whichever worker accepted them; the worker
that finishes the head claims the next one (the conversation stays on that
worker, and so on its engine replica's warm cache).

A worker that died (SIGKILL, lost host) stops renewing: once its lease runs
out the next worker to look at the conversation takes the interrupted turn
over and continues its reply from the token ids saved with it
(``bot.turns.partials``, docs/replies.md): the user's message is edited on,
the turn ends ``done``. A turn is failed with an apology instead only when it
cannot be continued: taken over ``MAX_TAKEOVERS`` times already, older than
``TAKEOVER_WINDOW_S``, asked to stop, or saved without its token ids. Queued
turns a dead worker had claimed but not started are simply claimed again.

SQLite is single-process (``single_process_guard``): there, every lease left
by an earlier run is dead at start-up, and nothing of a reply is saved while
it streams, so interrupted turns fail at once.

The two protocols are two classes behind one interface: ``LocalClaims``
(SQLite: this process is the only worker, no lease is written) and
``LeasedClaims`` (PostgreSQL: leases under row locks, on the database's clock).
"""

from __future__ import annotations

import abc
import asyncio
import datetime as dt
import enum
import fcntl
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog
from sqlalchemy import String, bindparam, func, select, true, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.errors import ErrorClass
from bot.storage.db import create_read_sessionmaker, create_statement_sessionmaker, is_sqlite
from bot.storage.models import Turn, TurnStatus, as_utc, new_id, one_of, utcnow
from bot.turns.cancellation import stop_requested
from bot.turns.ending import TurnEnd, TurnEndings, apply_to_row
from bot.turns.replies import ReplySink, TurnAddress
from bot.turns.resumption import MAX_TAKEOVERS, TAKEOVER_WINDOW_S
from bot.turns.settings import WorkerSettings
from bot.turns.wakeups import WakeupListener

log = structlog.get_logger(__name__)

OPEN_STATUSES = (TurnStatus.QUEUED, TurnStatus.RUNNING)
_IS_OPEN = one_of(Turn.status, OPEN_STATUSES)
"""A turn not ended yet: the condition of every claim, poll and start."""
INTERRUPTED_APOLOGY = "Sorry, I was restarted while answering. Please ask again."
POLL_BATCH = 200
CLAIM_RETRIES = 3
NOT_LIVE = "running with no live generation (its final status could not be stored)"
WATCHDOG_GRACE_S = 10.0
"""How long a turn may stay ``running`` here with no live generation before the watchdog fails it.

Only a bug or a final write the database refused for good leaves one; the
claim of the conversation's next turn fails it at once, and the watchdog
catches the rest (a conversation with no next turn yet)."""
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


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class LeaseState:
    owner: str | None
    expires_at: dt.datetime | None

    def held_by_other(self, me: str, now: dt.datetime) -> bool:
        if self.owner is None or self.owner == me:
            return False
        return self.expires_at is not None and as_utc(self.expires_at) > now


Schedule = Callable[[str], None]
"""Start (or wake) the worker of a conversation."""
CancelHere = Callable[[str], bool]
"""Stop a turn running in this process; True the first time it is asked."""


class ClaimOutcome(enum.Enum):
    CLAIMED = "claimed"
    """The head is queued and now this worker's to run."""
    INTERRUPTED = "interrupted"
    """The head was running with no live worker: it has just been failed."""
    BUSY = "busy"
    """The head runs (here or on a live worker): nothing to claim now."""
    RACED = "raced"
    """The head changed while we looked: look again."""
    IDLE = "idle"
    """No open turn in the conversation."""


class TurnClaims(abc.ABC):
    """Claims a conversation's head turn for this process, fails dead turns, finds work."""

    exclusive: bool
    """Only this process uses the database (SQLite): no other worker can hold a lease."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        worker_id: str | None = None,
        lease_s: float = 30.0,
        poll_interval_s: float = 1.0,
        watchdog_grace_s: float = WATCHDOG_GRACE_S,
    ) -> None:
        self._sessions = sessions
        # Claims look at turns on every turn start and every poll: on SQLite a look that
        # queued for the write lock behind every other conversation's accepts and final
        # writes would hold up the first token for nothing. Short, they run on the loop's
        # thread (no trip to aiosqlite's).
        self._read_sessions = create_read_sessionmaker(sessions.kw["bind"], in_place=True)
        self.worker_id = worker_id or default_worker_id()
        self.lease = dt.timedelta(seconds=lease_s)
        self.poll_interval_s = poll_interval_s
        self.watchdog_grace_s = watchdog_grace_s
        self._tasks: list[asyncio.Task[None]] = []
        self._open_reply: Callable[[TurnAddress], ReplySink] | None = None
        self._endings: TurnEndings | None = None
        self._live: Callable[[], set[str]] = set
        self._dead_since: dict[str, float] = {}

    def bind(
        self,
        open_reply: Callable[[TurnAddress], ReplySink],
        endings: TurnEndings,
        live_turn_ids: Callable[[], set[str]],
    ) -> None:
        """Where interrupted turns end (the service's channels and endings), and which turns
        have a live generation in this process (only those keep their leases)."""
        self._open_reply = open_reply
        self._endings = endings
        self._live = live_turn_ids

    # -- claiming ----------------------------------------------------------------------

    async def claim_next(self, conversation_id: str) -> Turn | None:
        """The conversation's head turn for this worker to run, if it is queued and free.

        An interrupted head (running with no live worker) is failed with an
        apology first. None when the conversation is idle or busy elsewhere.
        """
        for _ in range(CLAIM_RETRIES):
            outcome, turn = await self._claim_head(conversation_id)
            if outcome == ClaimOutcome.CLAIMED:
                return turn
            if outcome == ClaimOutcome.INTERRUPTED and turn is not None:
                await self._apologise(turn)
                continue
            if outcome != ClaimOutcome.RACED:
                return None
        return None

    @abc.abstractmethod
    async def _claim_head(self, conversation_id: str) -> tuple[ClaimOutcome, Turn | None]: ...

    async def rehearse(self) -> None:
        """A claim's statements, run for a conversation that does not exist (``bot.warm_up``)."""
        outcome, _ = await self._claim_head(new_id())
        if outcome != ClaimOutcome.IDLE:
            raise RuntimeError(f"a rehearsed claim found a turn ({outcome.name})")

    @abc.abstractmethod
    def began_here(self, turn: Turn) -> None:
        """``turn`` was stored running by this process's accept (``TurnService.accept``)."""

    def _mark_interrupted(self, turn: Turn, owner: str | None, why: str | None = None) -> None:
        who = f"worker {owner}" if owner else "the previous run"
        message = why or f"interrupted: {who} stopped while running it"
        # What it said so far (saved for readers elsewhere) stays with it.
        apply_to_row(turn, self._interrupted_end(turn, message))

    def _interrupted_end(self, turn: Turn, message: str) -> TurnEnd:
        return TurnEnd.failed(
            ErrorClass.INTERNAL,
            message,
            text=turn.reply_text or "",
            timings_ms=dict(turn.layer_ms or {}),
            log_fields={"taken_over_by": self.worker_id},
            resumes=turn.resumes or 0,
        )

    async def _apologise(self, turn: Turn) -> None:
        """The one final answer of an interrupted turn: an apology, on its channel and stream."""
        assert self._endings is not None, "bind() before claiming"
        end = self._interrupted_end(turn, turn.error_message or "interrupted")
        if turn.id in self._endings.abandoned:
            # This process already failed it visibly (apology, stream, log line) when its
            # final write was refused; the row has now caught up.
            self._endings.abandoned.discard(turn.id)
            log.info("turn_recorded_late", turn_id=turn.id)
            return
        # Announced first: the apology may wait on a slow platform, the log line must not.
        await self._endings.announce(turn, end)
        if self._open_reply is not None:
            address = TurnAddress(turn.id, turn.conversation_id, turn.channel, dict(turn.reply_to))
            try:
                sink = self._open_reply(address)
            except Exception as exc:
                log.warning("apology_not_delivered", turn_id=turn.id, error=str(exc))
            else:
                await self._endings.apologise(sink, end, message=INTERRUPTED_APOLOGY)

    # -- watchdog ----------------------------------------------------------------------

    @abc.abstractmethod
    def _running_here(self) -> Any:
        """The SQL condition for a running turn this process is responsible for."""

    async def _running_ids(self, session: AsyncSession) -> set[str]:
        """The turns ``running`` here, as the database has them."""
        query = select(Turn.id).where(Turn.status == TurnStatus.RUNNING, self._running_here())
        return set(await session.scalars(query))

    async def _reap(self, running: set[str], schedule: Schedule) -> list[str]:
        """Fail turns left ``running`` here (``running``, as the poll read them) with no live
        generation for ``watchdog_grace_s``.

        Returns the ids it failed; their conversations are scheduled again.
        """
        now = time.monotonic()
        dead = running - self._live()
        self._dead_since = {turn_id: self._dead_since.get(turn_id, now) for turn_id in dead}
        failed = []
        for turn_id, since in list(self._dead_since.items()):
            if now - since < self.watchdog_grace_s:
                continue
            turn = await self._fail_dead(turn_id)
            self._dead_since.pop(turn_id, None)
            if turn is not None:
                failed.append(turn_id)
                self._forget(turn)
                schedule(turn.conversation_id)
        return failed

    @abc.abstractmethod
    def _forget(self, turn: Turn) -> None:
        """The turn is no longer this process's to run."""

    async def _fail_dead(self, turn_id: str) -> Turn | None:
        async with self._sessions() as session, session.begin():
            turn = (
                await session.scalars(
                    select(Turn)
                    .where(Turn.id == turn_id, Turn.status == TurnStatus.RUNNING)
                    .where(self._running_here())
                    .with_for_update()
                )
            ).one_or_none()
            if turn is None or turn_id in self._live():
                return None
            self._mark_interrupted(turn, self.worker_id, why=f"watchdog: {NOT_LIVE}")
        log.error("turn_watchdog_failed", turn_id=turn_id, conversation_id=turn.conversation_id)
        await self._apologise(turn)
        return turn

    # -- finding work ------------------------------------------------------------------

    @abc.abstractmethod
    async def _now(self, session: AsyncSession) -> dt.datetime:
        """The clock leases are judged on."""

    def _left_alone(
        self,
        status: str,
        owner: str | None,
        expires_at: dt.datetime | None,
        created_at: dt.datetime,
        now: dt.datetime,
    ) -> bool:
        """A conversation head this worker should not try to claim now."""
        return status == TurnStatus.RUNNING and owner == self.worker_id

    async def claimable_conversations(self) -> list[str]:
        """Conversations with a turn this worker could claim now (queued and free, or abandoned)."""
        async with self._read_sessions() as session:
            return await self._claimable(session)

    async def _claimable(self, session: AsyncSession) -> list[str]:
        """``claimable_conversations``, read in ``session``."""
        now = await self._now(session)
        rows = (
            await session.execute(
                select(
                    Turn.conversation_id,
                    Turn.status,
                    Turn.lease_owner,
                    Turn.lease_expires_at,
                    Turn.created_at,
                )
                .where(_IS_OPEN)
                .order_by(Turn.created_at)
                .limit(POLL_BATCH)
            )
        ).all()
        seen: set[str] = set()
        found: list[str] = []
        for conversation_id, status, owner, expires_at, created_at in rows:
            # Oldest first, so the first row of a conversation is its head: only the
            # head can be claimed, a free turn behind a busy head is not work yet.
            if conversation_id in seen:
                continue
            seen.add(conversation_id)
            if not self._left_alone(status, owner, expires_at, created_at, now):
                found.append(conversation_id)
        return found

    @abc.abstractmethod
    async def recover(self) -> None:
        """At start-up: drop the leases no live process can hold any more."""

    # -- background: renew and poll ----------------------------------------------------

    def start(self, schedule: Schedule, cancel: CancelHere) -> None:
        """Poll for claimable turns, dead turns and (several workers) leases and cancels."""
        self._tasks = [
            asyncio.create_task(self._poll_forever(schedule, cancel), name="turn-poller")
        ]

    async def _poll_once(self, schedule: Schedule, cancel: CancelHere) -> None:
        # One read session for all of a poll's looks: each session is a pooled checkout,
        # a BEGIN and a ROLLBACK and the ORM's set-up around them, on the event loop
        # every second, for a poll that rarely finds anything.
        async with self._read_sessions() as session:
            running = await self._running_ids(session)
            claimable = await self._claimable(session)
            stop = await self._cancel_requests(session)
        await self._reap(running, schedule)
        for conversation_id in claimable:
            schedule(conversation_id)
        for turn_id in stop:
            if cancel(turn_id):  # True the first time only
                log.info("turn_cancel_requested", turn_id=turn_id)

    async def _cancel_requests(self, session: AsyncSession) -> list[str]:
        """Turns running here that another worker was asked to stop (none but with leases)."""
        return []

    async def _poll_forever(self, schedule: Schedule, cancel: CancelHere) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self._poll_once(schedule, cancel)
            except Exception as exc:
                if stop_requested():
                    raise
                log.warning("turn_poll_failed", error=f"{type(exc).__name__}: {exc}")

    async def close(self) -> None:
        """Stop the background tasks."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []


_OPEN_HEAD = (
    select(Turn)
    .where(
        Turn.conversation_id == bindparam("conversation_id", type_=String),
        _IS_OPEN,
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
                update(Turn).where(_IS_OPEN).values(lease_owner=None, lease_expires_at=None)
            )


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
        .where(Turn.conversation_id == conversation_id, _IS_OPEN)
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
                .where(_IS_OPEN, Turn.lease_owner == self.worker_id)
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
                .where(Turn.lease_owner == self.worker_id, _IS_OPEN)
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
