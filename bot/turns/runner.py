"""Runs one turn: history -> prompt ids -> engine -> streamed reply -> stored history.

Knows nothing of HTTP or of any platform: replies go out through the
``ReplySink`` the turn's channel opens, and to SSE readers through
``TurnStreams``. Every turn ends with exactly one canonical ``turn`` log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.channels.base import ReplySink, TurnAddress, UsageAwareSink
from bot.config import GenerationSettings
from bot.engine.base import GenerationChunk, GenerationRequest, InferenceEngine
from bot.errors import USER_MESSAGES, BotError, ContextOverflow, ErrorClass
from bot.storage.models import Message, Turn, TurnStatus, utcnow
from bot.storage.queries import History, as_utc, load_history
from bot.storage.tokens import pack_token_ids
from bot.turns.cancellation import Cancellations
from bot.turns.chat_format import ChatFormat, UserTurn
from bot.turns.coalescing import claim_pending, coalesced_event, combined_content
from bot.turns.policy import TurnPolicy
from bot.turns.streams import TurnStreams
from bot.turns.timing import LayerClock

log = structlog.get_logger("bot.turn")

OpenReply = Callable[[TurnAddress], ReplySink]
TurnObserver = Callable[[dict[str, Any]], None]
"""Called with the fields of every canonical ``turn`` line (metrics hook in here)."""


@dataclass
class _Progress:
    """What a turn has produced so far; kept so a failure can record it."""

    text: str = ""
    generated: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    first_token_at: float | None = None
    finish_reason: str | None = None
    covered: list[Turn] = field(default_factory=list)
    """Queued turns this one answers too (coalescing)."""
    compaction_id: str | None = None
    history_entries: list[Message] = field(default_factory=list)
    """User and assistant entries, stored with the final status of a done turn."""


class TurnRunner:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        engine: InferenceEngine,
        chat_format: ChatFormat,
        streams: TurnStreams,
        generation: GenerationSettings,
        open_reply: OpenReply,
        observers: list[TurnObserver] | None = None,
        policy: TurnPolicy | None = None,
        cancellations: Cancellations | None = None,
    ) -> None:
        self.policy = policy or TurnPolicy()
        self.cancellations = cancellations or Cancellations()
        """Where stop requests reach a turn's generation (shared with ``TurnService``)."""
        self._sessions = sessions
        self._engine = engine
        self._chat_format = chat_format
        self._streams = streams
        self._generation = generation
        self._open_reply = open_reply
        self.observers: list[TurnObserver] = list(observers or [])

    async def run(self, turn_id: str, *, persist_ms: float | None = None) -> None:
        """Run a queued turn to its end (done or failed). Never raises for turn failures."""
        async with self._sessions() as session:
            # Locked: a cancel of the queued turn (``TurnService.cancel_turn``) either
            # lands first, and the turn never runs, or finds it running.
            turn = await session.get(Turn, turn_id, with_for_update=True)
            if turn is None or turn.status != TurnStatus.QUEUED:
                return
            turn.status = TurnStatus.RUNNING
            turn.started_at = utcnow()
            covered = await claim_pending(session, turn) if self.policy.coalesce else []
            await session.commit()
        for other in covered:
            await self._streams.close(other.id, "done", coalesced_event(other, turn.id))

        clock = LayerClock(turn.layer_ms)
        if persist_ms is not None:
            clock.layer_ms["persist"] = persist_ms
        received_at = as_utc(turn.created_at).timestamp()
        ingress_side = (
            clock.layer_ms["ingress"] + clock.layer_ms["auth"] + clock.layer_ms["persist"]
        )
        started_at = as_utc(turn.started_at or utcnow()).timestamp()
        clock.layer_ms["wait"] = max(0.0, (started_at - received_at) * 1000 - ingress_side)

        structlog.contextvars.bind_contextvars(
            turn_id=turn.id, conversation_id=turn.conversation_id
        )
        self._streams.open(turn.id)
        sink = self._open_reply(
            TurnAddress(turn.id, turn.conversation_id, turn.channel, dict(turn.reply_to))
        )
        progress = _Progress(covered=covered)
        # Generation runs as its own task: a stop request cancels it and nothing else,
        # so the final write below is never cut off (``bot.turns.cancellation``).
        generation = asyncio.create_task(self._generate(turn, sink, clock, progress))
        try:
            with self.cancellations.generating(turn.id, generation):
                await generation
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # This task itself was cancelled (shutdown past its grace): stop the
                # generation too and record the turn as cancelled all the same.
                current.uncancel()
                generation.cancel()
                await asyncio.gather(generation, return_exceptions=True)
            await self._fail(
                turn, sink, clock, progress, received_at, ErrorClass.CANCELLED, "cancelled"
            )
        except BotError as exc:
            await self._fail(
                turn, sink, clock, progress, received_at, exc.error_class, exc.message, exc.hint
            )
        except Exception as exc:
            log.exception("turn_crashed")
            await self._fail(
                turn,
                sink,
                clock,
                progress,
                received_at,
                ErrorClass.INTERNAL,
                f"{type(exc).__name__}: {exc}",
            )
        else:
            await self._succeed(turn, clock, progress, received_at)
        finally:
            structlog.contextvars.unbind_contextvars("turn_id", "conversation_id")

    async def _generate(
        self, turn: Turn, sink: ReplySink, clock: LayerClock, progress: _Progress
    ) -> None:
        with clock.measure("deliver"):
            await sink.start()
        with clock.measure("history"):
            async with self._sessions() as session:
                history = await load_history(session, turn.conversation_id)
                cache_salt = await self.policy.cache_salt(session, turn.conversation_id)
        with clock.measure("tokenize"):
            content = combined_content(turn, progress.covered)
            user = self._user_turn(history, content)
            prompt = history.prompt_ids + user.token_ids
        max_tokens = self._generation.max_tokens
        compactor = self.policy.compactor
        if history.prompt_ids and compactor and compactor.needed(len(prompt), max_tokens):
            # The history outgrew its window: rebuild the base once (the cache breaks here only).
            with clock.measure("compact"):
                compacted = await compactor.compact(
                    conversation_id=turn.conversation_id,
                    turn_id=turn.id,
                    content=content,
                    history=history,
                    max_tokens=max_tokens,
                    cache_salt=cache_salt,
                )
            if compacted is not None:
                history = compacted.history
                progress.compaction_id = compacted.compaction_id
                user = self._user_turn(history, content)
                prompt = history.prompt_ids + user.token_ids
        progress.prompt_tokens = len(prompt)
        if len(prompt) + max_tokens > self._engine.max_model_len:
            raise ContextOverflow(len(prompt), max_tokens, self._engine.max_model_len)

        request = GenerationRequest(
            request_id=turn.id,
            prompt_token_ids=prompt,
            max_tokens=max_tokens,
            temperature=self._generation.temperature,
            top_p=self._generation.top_p,
            cache_salt=cache_salt,
            session_key=turn.conversation_id,
        )
        final: GenerationChunk | None = None
        async with self._saving_partials(turn.id, progress):
            async for chunk in self._engine.generate(request):
                progress.generated.extend(chunk.token_ids)
                if chunk.token_ids and progress.first_token_at is None:
                    progress.first_token_at = time.time()
                if chunk.text:
                    progress.text += chunk.text
                    with clock.measure("deliver"):
                        await self._streams.append(turn.id, chunk.text)
                        await sink.delta(progress.text)
                if chunk.cached_tokens is not None:
                    progress.cached_tokens = chunk.cached_tokens
                if chunk.finished:
                    final = chunk
        if final is None:
            raise BotError(
                ErrorClass.UPSTREAM_PROTOCOL, "the engine stream ended without a final chunk"
            )
        progress.finish_reason = final.finish_reason
        if final.timings is not None:
            clock.add("queue", final.timings.queue_ms)
            clock.add("prefill", final.timings.prefill_ms)
            clock.add("decode", final.timings.decode_ms)
        if isinstance(sink, UsageAwareSink):
            sink.set_usage(self._usage(progress))
        with clock.measure("deliver"):
            await sink.finish(progress.text)

        # The reply is out: both entries join the token-exact history in the same
        # locked transaction as the final status (``_store_end``), so a turn another
        # worker has taken over meanwhile adds nothing to the history.
        progress.history_entries = [
            Message(
                conversation_id=turn.conversation_id,
                seq=history.next_seq,
                role="user",
                text=user.content,
                token_ids=pack_token_ids(user.token_ids),
                turn_id=turn.id,
            ),
            Message(
                conversation_id=turn.conversation_id,
                seq=history.next_seq + 1,
                role="assistant",
                text=progress.text,
                token_ids=pack_token_ids(progress.generated),
                turn_id=turn.id,
            ),
        ]

    def _saving_partials(
        self, turn_id: str, progress: _Progress
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Several workers: the reply so far goes to the turn row for readers elsewhere."""
        partials = self.policy.partials
        if partials is None:
            return contextlib.nullcontext()
        return partials.saving(turn_id, lambda: progress.text)

    def _user_turn(self, history: History, content: str) -> UserTurn:
        if history.ends_with_base:
            return self._chat_format.turn_after_closed(content)
        if history.prompt_ids:
            return self._chat_format.next_turn(history.last_assistant_ids, content)
        return self._chat_format.first_turn(content)

    @staticmethod
    def _policy_fields(progress: _Progress) -> dict[str, Any]:
        """What the turn policy did to a turn, only when it happened (log line, done event)."""
        fields: dict[str, Any] = {}
        if progress.compaction_id is not None:
            fields["compaction_id"] = progress.compaction_id
        if progress.covered:
            fields["coalesced"] = [turn.id for turn in progress.covered]
        return fields

    def _usage(self, progress: _Progress) -> dict[str, int | None]:
        prompt = progress.prompt_tokens
        cached = progress.cached_tokens
        return {
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "new_tokens": prompt - cached if prompt is not None and cached is not None else None,
            "completion_tokens": len(progress.generated),
        }

    def _timings(
        self, clock: LayerClock, progress: _Progress, received_at: float
    ) -> dict[str, Any]:
        now = time.time()
        ttft = (progress.first_token_at - received_at) * 1000 if progress.first_token_at else None
        return {
            "layer_ms": clock.rounded(),
            "ttft_ms": round(ttft, 3) if ttft is not None else None,
            "e2e_ms": round((now - received_at) * 1000, 3),
        }

    async def _store_end(
        self, turn: Turn, status: str, progress: _Progress, timings: dict[str, Any], **fields: Any
    ) -> None:
        async with self._sessions() as session, session.begin():
            # Locked, so the one final status is settled here: a turn another worker
            # took over (our lease ran out) is already final and stays as it is.
            row = await session.get(Turn, turn.id, with_for_update=True)
            if row is None or row.status in TurnStatus.FINAL:  # deleted, or taken over
                return
            row.status = status
            row.lease_owner = None
            row.lease_expires_at = None
            row.reply_text = progress.text
            row.prompt_tokens = progress.prompt_tokens
            row.cached_tokens = progress.cached_tokens
            row.completion_tokens = len(progress.generated)
            row.finish_reason = progress.finish_reason
            row.layer_ms = {
                **timings["layer_ms"],
                "ttft": timings["ttft_ms"],
                "e2e": timings["e2e_ms"],
            }
            row.finished_at = dt.datetime.now(dt.UTC)
            row.compaction_id = progress.compaction_id
            for name, value in fields.items():
                setattr(row, name, value)
            if status == TurnStatus.DONE:
                session.add_all(progress.history_entries)
            if self.policy.fair_use is not None:
                await self.policy.fair_use.charge_turn(session, row)

    async def _succeed(
        self, turn: Turn, clock: LayerClock, progress: _Progress, received_at: float
    ) -> None:
        timings = self._timings(clock, progress, received_at)
        await self._store_end(turn, TurnStatus.DONE, progress, timings)
        usage = self._usage(progress)
        await self._streams.close(
            turn.id,
            "done",
            {
                "turn_id": turn.id,
                "text": progress.text,
                "usage": usage,
                "finish_reason": progress.finish_reason,
                "timings_ms": {
                    **timings["layer_ms"],
                    "ttft": timings["ttft_ms"],
                    "e2e": timings["e2e_ms"],
                },
                **self._policy_fields(progress),
            },
        )
        self._emit(
            turn_id=turn.id,
            conversation_id=turn.conversation_id,
            status=TurnStatus.DONE,
            channel=turn.channel,
            finish_reason=progress.finish_reason,
            **usage,
            **timings,
            **self._policy_fields(progress),
        )

    async def _fail(
        self,
        turn: Turn,
        sink: ReplySink,
        clock: LayerClock,
        progress: _Progress,
        received_at: float,
        error_class: ErrorClass,
        message: str,
        hint: str | None = None,
    ) -> None:
        user_message = USER_MESSAGES[error_class]
        try:
            with clock.measure("deliver"):
                await sink.fail(error_class, user_message)
        except Exception as exc:  # the apology itself could not be delivered
            log.warning("apology_not_delivered", error=f"{type(exc).__name__}: {exc}")
        timings = self._timings(clock, progress, received_at)
        await self._store_end(
            turn,
            TurnStatus.FAILED,
            progress,
            timings,
            error_class=error_class.value,
            error_message=message,
        )
        await self._streams.close(
            turn.id,
            "error",
            {"turn_id": turn.id, "error_class": error_class.value, "message": user_message},
        )
        self._emit(
            turn_id=turn.id,
            conversation_id=turn.conversation_id,
            status=TurnStatus.FAILED,
            channel=turn.channel,
            error_class=error_class.value,
            error=message,
            hint=hint,
            **self._usage(progress),
            **timings,
            **self._policy_fields(progress),
        )

    def _emit(self, **fields: Any) -> None:
        """The canonical per-turn log line, and the same fields to every observer."""
        log.info("turn", **fields)
        for observer in self.observers:
            try:
                observer(fields)
            except Exception:
                log.exception("turn_observer_failed")
