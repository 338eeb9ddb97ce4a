"""Which worker runs which turn: what the two claim protocols share (``TurnClaims``).

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

The two protocols are two classes behind this interface: ``LocalClaims``
(SQLite, ``bot.turns.claims``: this process is the only worker, no lease is
written) and ``LeasedClaims`` (PostgreSQL, ``bot.turns.leases``: leases under
row locks, on the database's clock).
"""

from __future__ import annotations

import abc
import asyncio
import datetime as dt
import enum
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.errors import ErrorClass
from bot.storage.db import create_read_sessionmaker
from bot.storage.models import Turn, TurnStatus, new_id, one_of
from bot.turns.cancellation import stop_requested
from bot.turns.ending import TurnEnd, TurnEndings, apply_to_row
from bot.turns.replies import ReplySink, TurnAddress

log = structlog.get_logger(__name__)

OPEN_STATUSES = (TurnStatus.QUEUED, TurnStatus.RUNNING)
IS_OPEN = one_of(Turn.status, OPEN_STATUSES)
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


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


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
                .where(IS_OPEN)
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
