"""Runs a conversation's turns in order, one worker task per conversation, concurrently across.

A conversation's worker runs its queued turns one after another, so a message
always waits for the reply to the one before it, while different conversations
run side by side (and vLLM batches them). A turn its accept stored running
(``BegunTurn``) is handed to a worker started for it inside the accept.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import structlog

from bot.storage import conversations
from bot.storage.models import Turn, TurnStatus
from bot.turns.cancellation import Cancellations
from bot.turns.claiming import TurnClaims

log = structlog.get_logger(__name__)

PERSIST_TIMINGS_KEPT = 10_000
FINAL_WRITE_TIMEOUT_S = 10.0
"""At shutdown, how long a stopped turn may take to record itself before it is cut off."""
WORKER_RESTART_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Pauses before a crashed conversation worker starts again (the last one repeats)."""


@dataclass(frozen=True)
class BegunTurn:
    """A turn its accept stored running, for its conversation's worker to run first."""

    turn: Turn
    head: conversations.ConversationHead | None
    """The conversation's head, read in the accept's transaction: the history the turn
    answers (no head moves while a turn of the conversation is open: a branch switch is
    refused, a compaction is the turn's own)."""


class ConversationWorkers:
    """The per-conversation worker tasks of this process, the turns they run, and draining."""

    def __init__(
        self,
        claims: TurnClaims,
        cancellations: Cancellations,
        *,
        runs_turns: bool,
        background: set[asyncio.Task[None]],
    ) -> None:
        """``background``: other tasks of the service's (apologies for declined messages),
        waited for with the workers when idle is awaited and at shutdown."""
        self.claims = claims
        self.cancellations = cancellations
        self._background = background
        self.runs_turns = runs_turns
        """False in an ingress-only process (``workers.run_turns``): it runs no turn."""
        self._runner: TurnRunnerLike | None = None
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._active: dict[str, tuple[str, asyncio.Task[None]]] = {}
        # Persist time of accepted turns, handed to the runner when the turn starts.
        # Bounded: turns that never start here (coalesced, run by another worker)
        # would otherwise stay in it for ever.
        self._persist_ms: OrderedDict[str, float] = OrderedDict()
        self._accepting = True
        self._recovered = False
        """Set once ``recover`` has scheduled what an earlier run left: turns begin at
        their accept only after that (``begins_at_accept``)."""

    def set_runner(self, runner: TurnRunnerLike) -> None:
        """The runner, built once the engine and the chat format are loaded."""
        self._runner = runner

    def note_persisted(self, turn_id: str, persist_ms: float) -> None:
        """How long ``turn_id``'s accept took to store it, for its run's timings."""
        self._persist_ms[turn_id] = persist_ms
        while len(self._persist_ms) > PERSIST_TIMINGS_KEPT:
            self._persist_ms.popitem(last=False)

    def begins_at_accept(self, conversation_id: str) -> bool:
        """True when the turn being accepted can be stored running, begun by this process.

        Only where one process owns the database (``claims.exclusive``, SQLite),
        turns run here and no worker has this conversation: every turn of a
        conversation is then run by its one worker, which leaves only when none
        is open (``_work_once``), so this turn is its head. Not before ``recover``
        has scheduled what an earlier run left queued, nor while draining.
        """
        return (
            self.claims.exclusive
            and self.runs_turns
            and self._accepting
            and self._recovered
            and conversation_id not in self._workers
        )

    def start_worker(self, conversation_id: str) -> asyncio.Future[BegunTurn | None]:
        """The conversation's worker, set up before the accept commits: it first runs the
        turn the returned future gives (None: the accept rolled back).

        Set up inside the accept's transaction, with no await in between, so that a
        second accept for the conversation finds the worker and stores its turn queued.
        """
        begun: asyncio.Future[BegunTurn | None] = asyncio.get_running_loop().create_future()
        self._workers[conversation_id] = asyncio.create_task(
            self._work(conversation_id, begun), name=f"conv-{conversation_id}"
        )
        return begun

    def running_turn(self, conversation_id: str) -> str | None:
        """The turn of ``conversation_id`` this process runs (or is starting), if any."""
        active = self._active.get(conversation_id)
        return active[0] if active is not None else None

    def _runs_here(self, turn_id: str) -> bool:
        return any(running_id == turn_id for running_id, _ in self._active.values())

    def cancel_here(self, turn_id: str) -> bool:
        """Stop ``turn_id`` if this process runs it (or is starting it)."""
        if not self._runs_here(turn_id):
            return False
        self.cancellations.request(turn_id)
        return True

    def on_cancel_request(self, turn_id: str) -> bool:
        """Another worker asked to stop a turn running here: True the first time it is seen."""
        return self._runs_here(turn_id) and self.cancellations.request(turn_id)

    # -- scheduling --------------------------------------------------------------------

    def schedule(self, conversation_id: str) -> None:
        if not self._accepting or not self.runs_turns:
            return
        self._dirty.add(conversation_id)
        if conversation_id not in self._workers:
            task = asyncio.create_task(self._work(conversation_id), name=f"conv-{conversation_id}")
            self._workers[conversation_id] = task

    async def _work(
        self, conversation_id: str, begun: asyncio.Future[BegunTurn | None] | None = None
    ) -> None:
        """Run the conversation's queued turns in order until none is left.

        ``begun``: a turn the accept stored running (``start_worker``), run first.
        A failure here (the database refusing a claim or a turn's start) must
        not end the conversation: the worker logs it and starts again after a
        pause, so the conversation's next turn is still answered.
        """
        # The worker outlives the request that started it: do not log under its request id.
        structlog.contextvars.clear_contextvars()
        runner = self._runner
        assert runner is not None, "set_runner() before accepting turns"
        crashes = 0
        try:
            if begun is not None and (first := await begun) is not None:
                # Run even if draining began meanwhile: it is stored running, and a turn
                # left running with no generation would end as interrupted, not answered.
                self.claims.began_here(first.turn)
                await self._run(conversation_id, runner, first.turn, begun=first)
            while True:
                try:
                    if not await self._work_once(conversation_id, runner):
                        return
                    crashes = 0
                except Exception:
                    log.exception("conversation_worker_crashed", conversation_id=conversation_id)
                    pause = WORKER_RESTART_BACKOFF_S[
                        min(crashes, len(WORKER_RESTART_BACKOFF_S) - 1)
                    ]
                    crashes += 1
                    await asyncio.sleep(pause)
                    self._dirty.add(conversation_id)
                    if not self._accepting:
                        return
        finally:
            self._workers.pop(conversation_id, None)

    async def _work_once(self, conversation_id: str, runner: TurnRunnerLike) -> bool:
        """One pass over the conversation's queue; False once the worker may stop."""
        self._dirty.discard(conversation_id)
        # Draining (SIGTERM): start nothing new; queued turns stay queued
        # for the next start instead of being begun and then cancelled.
        while self._accepting:
            # The head turn, leased to this worker; None when it runs elsewhere.
            turn = await self.claims.claim_next(conversation_id)
            if turn is None:
                break
            await self._run(conversation_id, runner, turn)
        # No await between this check and the removal (in ``_work``): a concurrent
        # schedule() either saw this worker or will start a new one.
        return conversation_id in self._dirty and self._accepting

    async def _run(
        self,
        conversation_id: str,
        runner: TurnRunnerLike,
        turn: Turn,
        *,
        begun: BegunTurn | None = None,
    ) -> None:
        """Run one turn of the conversation to its end (``begun``: stored running already)."""
        task = asyncio.create_task(
            runner.run(
                turn.id,
                persist_ms=self._persist_ms.pop(turn.id, None),
                # A turn taken over from a dead worker is running already (``claims``).
                begun=begun.turn
                if begun
                else (turn if turn.status == TurnStatus.RUNNING else None),
                head=begun.head if begun else None,
            )
        )
        self._active[conversation_id] = (turn.id, task)
        try:
            # A cancelled turn ends its own task; the worker goes on.
            await asyncio.shield(task)
        finally:
            self._active.pop(conversation_id, None)
            self.cancellations.forget(turn.id)

    def live_turn_ids(self) -> set[str]:
        """Turns with a live generation (or final write) in this process."""
        return {turn_id for turn_id, _ in self._active.values()}

    async def recover(self) -> None:
        """At start-up: resume queued turns; fail turns a dead worker left half-done.

        Dead means: any earlier run on SQLite (single process), a lease run out
        on PostgreSQL. ``bot.turns.claiming`` then keeps polling for such turns.
        The claims are bound (``TurnClaims.bind``) before.
        """
        if not self.runs_turns:
            return  # the workers that run turns recover and poll; this process only accepts
        await self.claims.recover()
        for conversation_id in await self.claims.claimable_conversations():
            self.schedule(conversation_id)
        self.claims.start(self.schedule, self.on_cancel_request)
        self._recovered = True

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._active)

    async def wait_idle(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until every scheduled turn has finished (tests).

        A wait that gives up (``timeout``) leaves the work running: ``asyncio.wait``
        does not cancel what it waits for, as ``gather`` would have cancelled the
        conversations' workers and left their queued turns to the next claims poll.
        """
        async with asyncio.timeout(timeout):
            while self._workers or self._background:
                done, _ = await asyncio.wait([*self._workers.values(), *self._background])
                for task in done:  # retrieved here, as gather did: nothing logged at exit
                    _ = task.cancelled() or task.exception()

    async def shutdown(self, grace_s: float) -> int:
        """Stop scheduling; let running turns finish within ``grace_s``, cancel the rest.

        Returns how many running turns were cancelled. Queued turns stay queued
        and are resumed by the next start (``recover``).
        """
        self._accepting = False
        workers = list(self._workers.values())
        if not workers and not self._background:
            await self.claims.close()
            return 0
        # One grace period for everything still going: running turns and apologies.
        _, pending = await asyncio.wait([*workers, *self._background], timeout=grace_s)
        cancelled = 0
        for turn_id, task in list(self._active.values()):
            if not task.done() and self.cancellations.request(turn_id):
                cancelled += 1
        # A stopped turn still records itself as cancelled; give that a bounded moment.
        running = [task for _, task in self._active.values() if not task.done()]
        if running:
            _, stuck = await asyncio.wait(running, timeout=FINAL_WRITE_TIMEOUT_S)
            for task in stuck:
                task.cancel()
        for worker in pending:
            worker.cancel()
        await asyncio.gather(*workers, *self._background, return_exceptions=True)
        for _, task in list(self._active.values()):
            await asyncio.gather(task, return_exceptions=True)
        await self.claims.close()
        return cancelled


class TurnRunnerLike(Protocol):
    """The runner as the service uses it (``bot.turns.runner.TurnRunner``)."""

    async def run(
        self,
        turn_id: str,
        *,
        persist_ms: float | None = None,
        begun: Turn | None = None,
        head: conversations.ConversationHead | None = None,
    ) -> None: ...
