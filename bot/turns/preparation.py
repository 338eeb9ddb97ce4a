"""The next base of a long conversation, prepared off the user's turn.

A compaction (``bot.turns.compaction``) breaks the prefix cache: the turn that
switches to a rebuilt base would prefill all of it, and first wait for the
summary. So once a conversation's prompt passes ``prepare_watermark``, the
worker that ran its turn prepares the next base in the background, after the
turn has ended:

1. it claims the conversation's ``prepared_bases`` row (one per conversation;
   insert if absent, else compare-and-set on the claim it saw), so that one
   worker prepares at a time;
2. plans the base as a compaction would, over the history as it is now (the
   summary request runs here), leaving room for the exchanges still to come
   before the switch (``high_watermark - prepare_watermark``), and stores it in
   the claimed row, marked ready;
3. prefills it with a one-token generation: the base's blocks are then in
   vLLM's prefix cache, under the conversation's tenant salt.

The conversation goes on meanwhile. The base that the switch turn uses is the
prepared one *rolled forward* over the entries since (``bot.turns.rolled_bases``).
Each turn's end rolls this worker's copy forward in memory, and the worker
prefills that rolled-forward base again, which computes only the new
exchange's tokens. The summary and the prefills run at ``BACKGROUND_PRIORITY``:
the engine schedules users' turns before them where it can.

At the switch (``take``) the turn uses the base rolled forward to exactly its
history, from memory, without reading anything. When there is none (the
summary is still being written, or another worker prepared the base) and the
turn's uncompacted prompt still fits the window, the switch waits for a later
turn: this one goes on uncompacted (``bot.turns.compaction``). Only a turn
whose prompt no longer fits waits for this worker's preparation and then reads
the row.

The history is a tree (``bot.storage.history.path_entries``): a row describes
the path from the root to the entry it was prepared up to (``head_seq``). It is
used only if that entry is still on the path the turn continues (an edit or a
regeneration of it, or activating another branch, leaves it on a path no longer
prompted), with the same latest base, the history still starting with exactly
the ids the row was prepared from (their SHA-256), followed by the path's
entries since. A stale row is prepared again after the turn. A crash between
claim and fill leaves a row that is never ready: another preparation takes it
over once its lease (``PREPARE_LEASE_S``) has passed; until then a turn whose
prompt no longer fits compacts itself.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import delete, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.engine.base import BACKGROUND_PRIORITY, GenerationRequest, InferenceEngine
from bot.storage.history import History, load_history, path_entries
from bot.storage.models import BASE_ROLE, Message, PreparedBase, as_utc, utcnow
from bot.storage.tokens import pack_token_ids, unpack_token_ids
from bot.turns.chat_format import ChatFormat
from bot.turns.rolled_bases import PathStep, RolledBase, RolledBases
from bot.turns.settings import CompactionSettings

log = structlog.get_logger("bot.compaction")

PREPARE_LEASE_S = 120.0
"""How long a claimed preparation may take before another worker may take it over."""


@dataclass(frozen=True)
class Plan:
    """A next base, not stored yet: its ids and what it keeps, drops and says."""

    base_ids: list[int]
    summary: str | None
    summary_tokens: int
    kept_from_seq: int | None
    dropped_exchanges: int
    kept_exchanges: int
    prepared: bool = False
    """Made ahead of the turn (``Preparation``), rolled forward to the turn's history."""


PlanBase = Callable[..., Awaitable[Plan | None]]
"""``Compactor.plan``: (conversation_id, request_key, reserve, max_tokens, cache_salt,
head_seq, system_prompt) -> the base a compaction of that path would write now, or None
(nothing to drop)."""


def digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(pack_token_ids(list(ids))).hexdigest()


async def _path(
    session: AsyncSession, conversation_id: str, head_seq: int | None
) -> list[PathStep]:
    """The prompted path up to ``head_seq``: from the latest base on it (or the root)."""
    if head_seq is None:
        return []
    return [
        PathStep(entry.seq, entry.role, entry.text, unpack_token_ids(entry.token_ids))
        for entry in await path_entries(session, conversation_id, head_seq)
    ]


def _base_seq(path: Sequence[PathStep]) -> int:
    """The seq of the latest base on the path; -1 before its first compaction."""
    return path[0].seq if path and path[0].role == BASE_ROLE else -1


def _since(path: Sequence[PathStep], seq: int | None) -> list[PathStep] | None:
    """The path's entries below ``seq``; None when ``seq`` is not on the path (another branch).

    ``seq`` None is the empty history, above every path.
    """
    if seq is None:
        return list(path)
    for index, entry in enumerate(path):
        if entry.seq == seq:
            return list(path[index + 1 :])
    return None


def _insert(session: AsyncSession) -> Any:
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def _as_plan(rolled: RolledBase) -> Plan:
    return Plan(
        base_ids=rolled.base_ids,
        summary=rolled.summary,
        summary_tokens=0,
        kept_from_seq=rolled.kept_from_seq
        if rolled.kept_from_seq is not None
        else rolled.first_seq,
        dropped_exchanges=rolled.dropped_exchanges,
        kept_exchanges=rolled.kept_exchanges + rolled.exchanges,
        prepared=True,
    )


class Preparation:
    def __init__(
        self,
        *,
        settings: CompactionSettings,
        chat_format: ChatFormat,
        engine: InferenceEngine,
        sessions: async_sessionmaker[AsyncSession],
        read_sessions: async_sessionmaker[AsyncSession],
        plan: PlanBase,
        reasoning_dropped: bool,
    ) -> None:
        self._settings = settings
        self._format = chat_format
        self._engine = engine
        self._sessions = sessions
        self._read_sessions = read_sessions
        self._plan = plan
        self._reasoning_dropped = reasoning_dropped
        self._tasks: dict[str, asyncio.Task[None]] = {}
        """Each conversation's latest preparation: a switch that cannot wait for later waits
        for it."""
        self._warms: set[asyncio.Task[None]] = set()
        """Prefills that only keep a prepared base in the prefix cache: nothing waits for them."""
        self._rolled = RolledBases()
        """Each conversation's prepared base, rolled forward to the last path seen here."""

    @property
    def reserve(self) -> int:
        """Room a prepared base leaves for the exchanges that come before the switch."""
        share = self._settings.high_watermark - self._settings.prepare_at
        return int(share * self._engine.max_model_len)

    def _too_long(self, base_ids: Sequence[int], max_tokens: int) -> bool:
        """A base past the high watermark: switching to it would call for the next at once."""
        high = self._settings.high_watermark * self._engine.max_model_len
        return len(base_ids) + max_tokens > high

    # -- after a turn ---------------------------------------------------------------------

    def after_turn(
        self,
        conversation_id: str,
        *,
        tokens: int,
        max_tokens: int,
        cache_salt: str | None,
        system_prompt: str | None = None,
        stored: Sequence[Message] = (),
    ) -> None:
        """A turn ended with ``tokens`` in its prompt + reply and stored the entries ``stored``.

        The base kept here is rolled forward over them at once, in memory, so that a next
        message arriving right away finds it. Past ``prepare_watermark``, the rest runs in
        the background: prepare the base, or prefill the rolled-forward one. Preparations
        of one conversation run one at a time, in order; each warm-up prefill they start
        runs as a task of its own (``_warm_soon``).
        """
        if not self._settings.prepare_ahead:
            return
        rolled = self._rolled.extend(conversation_id, self._format, stored)
        if rolled is not None and self._too_long(rolled.base_ids, max_tokens):
            self._rolled.drop(conversation_id)  # prepared again from the history below
        if tokens + max_tokens <= self._settings.prepare_at * self._engine.max_model_len:
            return
        head_seq = stored[-1].seq if stored else None
        previous = self._tasks.get(conversation_id)
        task = asyncio.create_task(
            self._background(
                conversation_id, head_seq, max_tokens, cache_salt, system_prompt, previous
            ),
            name=f"prepare-base-{conversation_id}",
        )
        self._tasks[conversation_id] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._tasks.get(conversation_id) is done:
                del self._tasks[conversation_id]

        task.add_done_callback(forget)

    async def settle(self, conversation_id: str) -> None:
        """Wait for this process's preparation of the conversation, not for a warm-up prefill.

        A warm-up still under way when the next turn comes (turns back to back) is not
        waited for: the turn's own prompt starts with the same ids, so the engine reuses
        whatever blocks the warm-up has computed by then and computes the rest once, for
        both. Waiting would add the warm-up's round trip to the turn's first token.
        """
        task = self._tasks.get(conversation_id)
        if task is not None:
            await asyncio.gather(asyncio.shield(task), return_exceptions=True)

    async def close(self) -> None:
        """Stop background work (shutdown): a half-done preparation is simply never ready."""
        tasks = [*self._tasks.values(), *self._warms]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _background(
        self,
        conversation_id: str,
        head_seq: int | None,
        max_tokens: int,
        cache_salt: str | None,
        system_prompt: str | None,
        previous: asyncio.Task[None] | None,
    ) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        try:
            if head_seq is not None and self._rolled.head_seq(conversation_id) == head_seq:
                # Rolled forward as the turn ended: nothing to read, only to prefill.
                self._warm_latest(conversation_id, cache_salt)
                return
            await self._prepare_or_warm(conversation_id, max_tokens, cache_salt, system_prompt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Only the switch turn's speed depends on it: it compacts in the turn instead.
            log.warning(
                "base_preparation_failed",
                conversation_id=conversation_id,
                error=f"{type(exc).__name__}: {exc}",
            )

    async def _prepare_or_warm(
        self,
        conversation_id: str,
        max_tokens: int,
        cache_salt: str | None,
        system_prompt: str | None,
    ) -> None:
        async with self._read_sessions() as session:
            history = await load_history(session, conversation_id)
            path = await _path(session, conversation_id, history.head_seq)
            row = await session.get(PreparedBase, conversation_id)
        if history.head_seq is None:
            return
        base_seq = _base_seq(path)
        if row is not None and row.ready:
            rolled = self._roll_forward(row, base_seq, history, path)
            if rolled is not None and not self._too_long(rolled.base_ids, max_tokens):
                self._rolled.put(conversation_id, rolled)
                self._warm_latest(conversation_id, cache_salt)
                return
            log.info(
                "prepared_base_stale" if rolled is None else "prepared_base_too_long",
                conversation_id=conversation_id,
            )
            self._rolled.drop(conversation_id)
        elif row is not None and as_utc(row.lease_until) > utcnow():
            return  # another preparation is under way (here or on another worker)
        claim = uuid.uuid4().hex
        seen = row.claim if row is not None else None
        if not await self._claim(conversation_id, claim, seen, history, base_seq):
            return
        plan = await self._plan(
            conversation_id=conversation_id,
            request_key=f"prepare-{claim}",
            reserve=self.reserve,
            max_tokens=max_tokens,
            cache_salt=cache_salt,
            head_seq=history.head_seq,
            system_prompt=system_prompt,
            priority=BACKGROUND_PRIORITY,
        )
        if plan is None:
            async with self._sessions() as session, session.begin():
                await session.execute(
                    delete(PreparedBase).where(
                        PreparedBase.conversation_id == conversation_id,
                        PreparedBase.claim == claim,
                    )
                )
            return
        if not await self._fill(conversation_id, claim, plan):
            return
        log.info(
            "base_prepared",
            conversation_id=conversation_id,
            tokens=len(plan.base_ids),
            covered_tokens=len(history.prompt_ids),
            dropped_exchanges=plan.dropped_exchanges,
            kept_exchanges=plan.kept_exchanges,
            summary_tokens=plan.summary_tokens,
        )
        self._rolled.put(
            conversation_id,
            RolledBase(
                head_seq=history.head_seq,
                path_ids=list(history.prompt_ids),
                open_ids=plan.base_ids,
                closing_ids=[],
                exchanges=0,
                first_seq=None,
                summary=plan.summary,
                kept_from_seq=plan.kept_from_seq,
                dropped_exchanges=plan.dropped_exchanges,
                kept_exchanges=plan.kept_exchanges,
            ),
        )
        self._warm_latest(conversation_id, cache_salt)

    async def _claim(
        self,
        conversation_id: str,
        claim: str,
        seen: str | None,
        history: History,
        base_seq: int,
    ) -> bool:
        now = utcnow()
        values: dict[str, Any] = {
            "claim": claim,
            "ready": False,
            "lease_until": now + dt.timedelta(seconds=PREPARE_LEASE_S),
            "after_base_seq": base_seq,
            "head_seq": history.head_seq,
            "covered_tokens": len(history.prompt_ids),
            "covered_digest": digest(history.prompt_ids),
            "token_ids": None,
            "kept_from_seq": None,
            "summary": None,
            "dropped_exchanges": 0,
            "kept_exchanges": 0,
            "reasoning_dropped": self._reasoning_dropped,
            "created_at": now,
        }
        async with self._sessions() as session, session.begin():
            if seen is None:
                statement = (
                    _insert(session)(PreparedBase)
                    .values(conversation_id=conversation_id, **values)
                    .on_conflict_do_nothing(index_elements=["conversation_id"])
                )
            else:
                # Compare-and-set: only the row as this worker judged it is replaced.
                statement = (
                    update(PreparedBase)
                    .where(
                        PreparedBase.conversation_id == conversation_id,
                        PreparedBase.claim == seen,
                    )
                    .values(**values)
                )
            result = await session.execute(statement)
            return bool(getattr(result, "rowcount", 0) == 1)

    async def _fill(self, conversation_id: str, claim: str, plan: Plan) -> bool:
        async with self._sessions() as session, session.begin():
            result = await session.execute(
                update(PreparedBase)
                .where(
                    PreparedBase.conversation_id == conversation_id,
                    PreparedBase.claim == claim,
                )
                .values(
                    ready=True,
                    token_ids=pack_token_ids(plan.base_ids),
                    summary=plan.summary,
                    kept_from_seq=plan.kept_from_seq,
                    dropped_exchanges=plan.dropped_exchanges,
                    kept_exchanges=plan.kept_exchanges,
                )
            )
            return bool(getattr(result, "rowcount", 0) == 1)

    def _warm_latest(self, conversation_id: str, cache_salt: str | None) -> None:
        """Prefill the base kept for the conversation, unless that path's is prefilled already."""
        rolled = self._rolled.to_prefill(conversation_id)
        if rolled is not None:
            self._warm_soon(conversation_id, rolled.base_ids, cache_salt)

    def _warm_soon(self, conversation_id: str, ids: list[int], cache_salt: str | None) -> None:
        """Start ``_warm`` as a task of its own, off the preparation that ``settle`` waits for."""
        if len(ids) + 1 > self._engine.max_model_len:
            return
        task = asyncio.create_task(
            self._warm(conversation_id, ids, cache_salt), name=f"warm-base-{conversation_id}"
        )
        self._warms.add(task)
        task.add_done_callback(self._warms.discard)

    async def _warm(self, conversation_id: str, ids: list[int], cache_salt: str | None) -> None:
        """Prefill ``ids`` so that their whole blocks sit in the engine's prefix cache."""
        request = GenerationRequest(
            request_id=f"prepare-{uuid.uuid4().hex}:prefill",
            prompt_token_ids=ids,
            max_tokens=1,
            temperature=0.0,
            top_p=1.0,
            cache_salt=cache_salt,
            session_key=conversation_id,
            priority=BACKGROUND_PRIORITY,
        )
        try:
            async for _ in self._engine.generate(request):
                pass
        except Exception as exc:
            # Only the switch turn's speed depends on it: it prefills the base itself.
            log.warning(
                "base_warm_failed",
                conversation_id=conversation_id,
                error=f"{type(exc).__name__}: {exc}",
            )

    # -- at the switch ------------------------------------------------------------------

    async def take(self, conversation_id: str, history: History, *, wait: bool) -> Plan | None:
        """The prepared base rolled forward to ``history``; None if there is none or it is stale.

        From memory when this worker rolled it to exactly ``history``. Otherwise, with
        ``wait``, after this worker's preparation of the conversation, from the row;
        without, None at once (the base is not ready yet).
        """
        if not self._settings.prepare_ahead:
            return None
        rolled = self._rolled.at(conversation_id, history)
        if rolled is not None:
            return _as_plan(rolled)
        if not wait:
            return None
        await self.settle(conversation_id)
        rolled = self._rolled.at(conversation_id, history)
        if rolled is not None:
            return _as_plan(rolled)
        async with self._read_sessions() as session:
            row = await session.get(PreparedBase, conversation_id)
            if row is None or not row.ready:
                return None
            path = await _path(session, conversation_id, history.head_seq)
        rolled = self._roll_forward(row, _base_seq(path), history, path)
        if rolled is None:
            log.info("prepared_base_stale", conversation_id=conversation_id)
            return None
        return _as_plan(rolled)

    def _roll_forward(
        self,
        row: PreparedBase,
        base_seq: int,
        history: History,
        path: Sequence[PathStep],
    ) -> RolledBase | None:
        """The prepared base rolled forward over the path's entries since.

        None when the row no longer describes ``history``, the prompt of ``path``: the
        entry it was prepared up to is not on the path (an edit, a regeneration or another
        branch moved the head away from it), or the ids it covered changed.
        """
        if row.token_ids is None or row.after_base_seq != base_seq:
            return None
        entries = _since(path, row.head_seq)
        if entries is None:
            return None
        covered = history.prompt_ids[: row.covered_tokens]
        if len(covered) != row.covered_tokens or digest(covered) != row.covered_digest:
            return None
        if [i for entry in entries for i in entry.ids] != history.prompt_ids[row.covered_tokens :]:
            return None
        prepared = RolledBase(
            head_seq=row.head_seq,
            path_ids=covered,
            open_ids=unpack_token_ids(row.token_ids),
            closing_ids=[],
            exchanges=0,
            first_seq=None,
            summary=row.summary,
            kept_from_seq=row.kept_from_seq,
            dropped_exchanges=row.dropped_exchanges,
            kept_exchanges=row.kept_exchanges,
        )
        return prepared.extended(self._format, entries)
