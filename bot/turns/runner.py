"""Runs one turn: history -> prompt ids -> engine -> streamed reply -> stored history.

Knows nothing of HTTP or of any platform: replies go out through the
``ReplySink`` the turn's channel opens, and to SSE readers through
``TurnStreams``. Every turn ends with exactly one canonical ``turn`` log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from sqlalchemy import String, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.engine.base import GenerationChunk, GenerationRequest, InferenceEngine
from bot.errors import BotError, ContextOverflow, ErrorClass
from bot.storage.conversations import ConversationHead
from bot.storage.history import History, known_history, load_history
from bot.storage.known_paths import KnownPaths
from bot.storage.models import Message, Turn, TurnStatus, as_utc, new_id, utcnow
from bot.storage.text import storable
from bot.storage.tokens import pack_token_ids
from bot.turns.cancellation import Cancellations
from bot.turns.chat_format import ChatFormat, UserTurn
from bot.turns.coalescing import claim_pending, coalesced_end, combined_content
from bot.turns.ending import TurnEnd, TurnEndings, timings_of, usage
from bot.turns.finished import InFinalWrite, in_final_write
from bot.turns.limits import charge_summary
from bot.turns.partials import ReplySnapshot
from bot.turns.personas import PersonaChoice, Personas
from bot.turns.policy import TurnPolicy
from bot.turns.replies import ReplySink, TurnAddress, UsageAwareSink, delivery_of
from bot.turns.resumption import (
    ContinuedText,
    carried_ids,
    ended_before,
    engine_backoff,
    resumable,
)
from bot.turns.sampling import Sampling, ids_before_stop
from bot.turns.sampling import resolve as resolve_sampling
from bot.turns.settings import GenerationSettings
from bot.turns.streams import TurnStreams
from bot.turns.timing import LayerClock

log = structlog.get_logger("bot.turn")

OpenReply = Callable[[TurnAddress], ReplySink]

_START = (
    update(Turn)
    .where(Turn.id == bindparam("turn_id", type_=String), Turn.status == TurnStatus.QUEUED)
    .values(status=TurnStatus.RUNNING, started_at=bindparam("started_at"))
    .returning(Turn)
    .execution_options(synchronize_session=False)  # a new session: nothing to bring up to date
)
"""A queued turn's start; built once, it is on every turn's way to the first token."""


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
    cache_salt: str | None = None
    persona: PersonaChoice | None = None
    compaction_write: InFinalWrite | None = None
    """A compaction stored with the turn's end (a prepared base), its entries first in
    ``history_entries``."""
    summary_tokens: int = 0
    """Tokens the engine generated for the compaction's summary: fair use counts them."""
    compaction_entries: list[Message] = field(default_factory=list)
    history_entries: list[Message] = field(default_factory=list)
    """User and assistant entries, stored with the final status of a done turn."""
    carried: int = 0
    """Leading ids of ``generated`` another turn generated (a continuation of a cut reply)."""
    resumed: int = 0
    """Times the reply was continued from its saved ids (a worker taking it over, broken
    engine streams)."""
    delivered: str = ""
    """The text readers and the platform were given: always a prefix of ``text``."""
    saved: str = ""
    """The text the turn's row holds (several workers): all that may be delivered."""


class TurnRunner:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        read_sessions: async_sessionmaker[AsyncSession] | None = None,
        engine: InferenceEngine,
        chat_format: ChatFormat,
        streams: TurnStreams,
        generation: GenerationSettings,
        open_reply: OpenReply,
        endings: TurnEndings,
        policy: TurnPolicy | None = None,
        cancellations: Cancellations | None = None,
        personas: Personas | None = None,
        known_paths: KnownPaths | None = None,
    ) -> None:
        self.policy = policy or TurnPolicy()
        self.cancellations = cancellations or Cancellations()
        """Where stop requests reach a turn's generation (shared with ``TurnService``)."""
        self._sessions = sessions
        self._read_sessions = read_sessions or sessions
        """History reads: on SQLite these never take the write lock (``bot.storage.db``)."""
        self._engine = engine
        self._chat_format = chat_format
        self._streams = streams
        self._generation = generation
        self._personas = personas or Personas(generation=generation)
        """A conversation's persona picks its system prompt and sampling."""
        self._open_reply = open_reply
        self._endings = endings
        self._known_paths = known_paths or KnownPaths()
        """Each active conversation's last history path: a turn reads only what was added."""

    async def rehearse(self) -> None:
        """A turn's way to the engine, its statements run for a turn and a conversation that
        do not exist (``bot.warm_up``): the start finds nothing queued, the history nothing."""
        missing = new_id()
        if await self._start(missing) is not None:
            raise RuntimeError("a rehearsed start found a turn")
        async with self._read_sessions() as session:
            # Read at a given entry as a conversation's second turn is: the path's statement too.
            await load_history(session, missing, at=0)
        # The first text is saved before readers get it (several workers): its statement is
        # on the first reply's way too. It locks no row of a turn that does not exist.
        partials = self.policy.partials
        if partials is not None and await partials.save_all({missing: ReplySnapshot()}):
            raise RuntimeError("a rehearsed save found a turn")

    async def run(
        self,
        turn_id: str,
        *,
        persist_ms: float | None = None,
        begun: Turn | None = None,
        head: ConversationHead | None = None,
    ) -> None:
        """Run a turn to its end (done or failed). Never raises for turn failures.

        A queued turn is started here; ``begun`` is the row of one its accept
        stored running (``TurnService.accept``), ``head`` its conversation's head as
        read there. Only the start (queued -> running) may raise, a database error
        before the turn began: it stays queued and its conversation's worker tries again.
        """
        start_began = time.perf_counter()
        if begun is None:
            started = await self._start(turn_id)
            if started is None:
                return  # no longer queued: cancelled, or coalesced into another turn
            turn, covered = started
        else:
            turn, covered = begun, []
        for other in covered:
            await self._endings.announce(other, coalesced_end(other, turn.id))

        clock = LayerClock(turn.layer_ms)
        if persist_ms is not None:
            clock.layer_ms["persist"] = persist_ms
        # The start's transaction, its wait for the write lock included (SQLite); none
        # for a turn begun at its accept.
        clock.layer_ms["start"] = (
            (time.perf_counter() - start_began) * 1000 if begun is None else 0.0
        )
        received_at = as_utc(turn.created_at).timestamp()
        ingress_side = (
            clock.layer_ms["ingress"] + clock.layer_ms["auth"] + clock.layer_ms["persist"]
        )
        # From the accept's end to the start: a begun turn started in its accept, and
        # waited only for its worker to take it up.
        started_at = (
            time.time() if begun is not None else as_utc(turn.started_at or utcnow()).timestamp()
        )
        clock.layer_ms["wait"] = max(0.0, (started_at - received_at) * 1000 - ingress_side)

        structlog.contextvars.bind_contextvars(
            turn_id=turn.id, conversation_id=turn.conversation_id
        )
        self._streams.open(turn.id)
        # Taken over from a dead worker (``claims``): counted with the continued streams.
        # (A turn begun at its accept is the object stored there: no column default read back.)
        progress = _Progress(covered=covered, resumed=turn.resumes or 0)
        carried = carried_ids(turn)
        if carried:
            # Taken over from a dead worker, or a continuation: the reply so far is out.
            progress.generated = carried
            progress.text = progress.saved = progress.delivered = turn.reply_text or ""
            progress.carried = turn.continued_tokens or 0
            await self._streams.append(turn.id, progress.text)
        sink: ReplySink | None = None
        try:
            sink = self._open_reply(
                TurnAddress(
                    turn.id,
                    turn.conversation_id,
                    turn.channel,
                    dict(turn.reply_to),
                    delivery=turn.delivery if carried else None,
                )
            )
            # Generation runs as its own task: a stop request cancels it and nothing else,
            # so the final write below is never cut off (``bot.turns.cancellation``).
            generation = asyncio.create_task(self._generate(turn, sink, clock, progress, head))
            try:
                with self.cancellations.generating(turn.id, generation):
                    await generation
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is None or not current.cancelling():
                    raise  # the generation was stopped: recorded as cancelled below
                # This task itself was cancelled (shutdown past its grace): stop the
                # generation too and record the turn as cancelled all the same.
                current.uncancel()
                generation.cancel()
                await asyncio.gather(generation, return_exceptions=True)
                raise
        except asyncio.CancelledError:
            end = TurnEnd.failed(ErrorClass.CANCELLED, "cancelled")
        except BotError as exc:
            end = TurnEnd.failed(exc.error_class, exc.message, hint=exc.hint)
        except Exception as exc:
            log.exception("turn_crashed")
            end = TurnEnd.failed(ErrorClass.INTERNAL, f"{type(exc).__name__}: {exc}")
        else:
            end = TurnEnd(TurnStatus.DONE)
        try:
            self._fill(end, clock, progress, received_at)
            await self._endings.finish(
                turn,
                end,
                sink=sink,
                history=progress.history_entries if end.status == TurnStatus.DONE else (),
                charge=in_final_write(
                    progress.compaction_write,
                    self.policy.fair_use.charge_turn if self.policy.fair_use else None,
                    charge_summary(self.policy.fair_use, progress.summary_tokens),
                ),
                known=self._known_paths,
            )
        finally:
            structlog.contextvars.unbind_contextvars("turn_id", "conversation_id")
        compactor = self.policy.compactor
        persona = progress.persona
        if (
            compactor is not None
            and persona is not None
            and end.status == TurnStatus.DONE
            and progress.prompt_tokens
        ):
            # Off the turn: a long conversation's next base is prepared (or kept warm) now,
            # so that the turn that switches to it does not pay for it.
            compactor.after_turn(
                turn.conversation_id,
                tokens=progress.prompt_tokens + len(progress.generated),
                max_tokens=persona.generation.max_tokens,
                cache_salt=progress.cache_salt,
                system_prompt=persona.chat_format.system_prompt,
                stored=progress.history_entries,
            )

    async def _start(self, turn_id: str) -> tuple[Turn, list[Turn]] | None:
        """Queued -> running: the turn, and the queued turns it answers too (coalescing)."""
        async with self._sessions() as session:
            # One locking statement starts it: a cancel of the queued turn
            # (``TurnService.cancel_turn``) either lands first, and nothing is updated,
            # or finds it running. No read before it: that is one more round trip and,
            # on SQLite, one more wait for the write lock on the way to the first token.
            turn = (
                await session.scalars(_START, {"turn_id": turn_id, "started_at": utcnow()})
            ).one_or_none()
            if turn is None:
                return None
            # An edit or a regeneration answers one given message: it covers no other.
            coalesces = self.policy.coalesce and turn.parent_seq is None
            covered = await claim_pending(session, turn) if coalesces else []
            await session.commit()
        return turn, covered

    async def _generate(
        self,
        turn: Turn,
        sink: ReplySink,
        clock: LayerClock,
        progress: _Progress,
        head: ConversationHead | None,
    ) -> None:
        with clock.measure("deliver"):
            await sink.start()
        if progress.generated and not progress.carried and turn.coalesced_into is None:
            # Taken over: the messages its first run answered together with its own.
            async with self._read_sessions() as session:
                progress.covered = list(
                    await session.scalars(
                        select(Turn).where(Turn.coalesced_into == turn.id).order_by(Turn.seq)
                    )
                )
        with clock.measure("history"):
            # A turn begun at its accept has its conversation's head from there: with its
            # path known (the conversation's last turn ran here), nothing is read, and no
            # session opened. An edit or a regeneration names where it forks off the tree.
            known = (
                known_history(turn.conversation_id, head, self._known_paths)
                if head is not None and turn.parent_seq is None
                else None
            )
            if known is not None:
                history = known
            else:
                async with self._read_sessions() as session:
                    history = await load_history(
                        session,
                        turn.conversation_id,
                        at=turn.parent_seq,
                        known=self._known_paths,
                        head=head,
                    )
        cache_salt = self.policy.cache_salt(history.owner)
        persona = self._personas.choice(history.persona, self._chat_format)
        progress.cache_salt = cache_salt
        progress.persona = persona
        # A regeneration forks at its user entry: the prompt is, id for id, the one the
        # earlier attempt had (cached up to its last partial block), no new user entry.
        answers_again = history.last_role == "user"
        with clock.measure("tokenize"):
            content = combined_content(turn, progress.covered)
            user = None if answers_again else self._user_turn(persona, history, content)
            prompt = history.prompt_ids + (user.token_ids if user else [])
        # The client's own parameters, stored with the turn, over the persona's settings.
        sampling = resolve_sampling(
            Sampling.from_json(turn.sampling),
            persona.generation,
            # A continuation goes on as its reply began: not a new attempt at it.
            regeneration=turn.regenerates_turn_id is not None and turn.continues_turn_id is None,
        )
        max_tokens = sampling.max_tokens
        compactor = self.policy.compactor
        if (
            user is not None
            and history.prompt_ids
            and compactor
            and compactor.needed(len(prompt), max_tokens)
        ):
            # The history outgrew its window: rebuild the base once (the cache breaks here
            # only), or go on as it is while it fits and the prepared base is not ready.
            with clock.measure("compact"):
                compacted = await compactor.compact(
                    conversation_id=turn.conversation_id,
                    turn_id=turn.id,
                    content=content,
                    history=history,
                    prompt_tokens=len(prompt),
                    max_tokens=max_tokens,
                    cache_salt=cache_salt,
                    system_prompt=persona.chat_format.system_prompt,
                )
            if compacted is not None:
                history = compacted.history
                progress.compaction_id = compacted.compaction_id
                # Engine work like the turn's own (a long history re-sent by a client too).
                progress.summary_tokens = compacted.summary_tokens
                progress.compaction_entries = list(compacted.entries)
                progress.compaction_write = compacted.write
                user = self._user_turn(persona, history, content)
                prompt = history.prompt_ids + user.token_ids
        progress.prompt_tokens = len(prompt) + len(progress.generated)
        # What is left of the turn's budget: a turn taken over generated some already; a
        # continuation gets a budget of its own, as far as the context window allows.
        max_tokens -= len(progress.generated) - progress.carried
        room = self._engine.max_model_len - len(prompt) - len(progress.generated)
        if progress.carried:
            max_tokens = min(max_tokens, room)
        if max_tokens > room or (progress.carried and max_tokens <= 0):
            raise ContextOverflow(progress.prompt_tokens, max_tokens, self._engine.max_model_len)

        def request(attempt: int) -> GenerationRequest:
            return GenerationRequest(
                # A continued stream is a new request: the broken one may still be aborting.
                request_id=turn.id if attempt == 0 else f"{turn.id}-{attempt}",
                prompt_token_ids=prompt + progress.generated,
                max_tokens=max_tokens - (len(progress.generated) - generated_before),
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                seed=sampling.seed,
                stop=sampling.stop,
                presence_penalty=sampling.presence_penalty,
                frequency_penalty=sampling.frequency_penalty,
                cache_salt=cache_salt,
                session_key=turn.conversation_id,
            )

        generated_before = len(progress.generated)
        tokenizer = persona.chat_format.tokenizer
        final: GenerationChunk | None = None
        ended = ended_before(progress.generated, max_tokens, tokenizer.eos_token_id)
        if ended is not None:
            # Its worker died after the last token, before its final write.
            final = GenerationChunk((), "", finished=True, finish_reason=ended)
        engine_resumes = 0
        async with self._saving_partials(turn, progress, sink):
            while final is None:
                continued = (
                    ContinuedText.after(tokenizer, prompt, progress.generated, progress.text)
                    if progress.generated
                    else None
                )
                try:
                    async for chunk in self._engine.generate(request(progress.resumed)):
                        progress.generated.extend(chunk.token_ids)
                        if chunk.token_ids and progress.first_token_at is None:
                            progress.first_token_at = time.time()
                        if continued is not None:
                            progress.text = continued.text(progress.generated, final=chunk.finished)
                        elif chunk.text:
                            # Storable from the start, so every reader and the row see the same.
                            progress.text += storable(chunk.text)
                        if chunk.cached_tokens is not None:
                            progress.cached_tokens = chunk.cached_tokens
                        if chunk.finished:
                            final = chunk
                        with clock.measure("deliver"):
                            await self._deliver(turn.id, sink, progress)
                except BotError as exc:
                    if final is not None or not resumable(exc, engine_resumes):
                        raise
                    left = max_tokens - (len(progress.generated) - generated_before)
                    ended = ended_before(progress.generated, left, tokenizer.eos_token_id)
                    if ended is not None:
                        # Broken after its last token, before its final chunk: complete.
                        final = GenerationChunk((), "", finished=True, finish_reason=ended)
                        break
                    # A broken stream (a replica killed, a dropped connection): continue
                    # from the ids so far, after a pause, a bounded number of times.
                    log.warning(
                        "engine_stream_resumed",
                        error_class=exc.error_class.value,
                        generated=len(progress.generated),
                    )
                    await asyncio.sleep(engine_backoff(engine_resumes))
                    engine_resumes += 1
                    progress.resumed += 1
                    continue
                if final is None:
                    raise BotError(
                        ErrorClass.UPSTREAM_PROTOCOL,
                        "the engine stream ended without a final chunk",
                    )
            if self.policy.partials is not None:
                # The whole reply is stored before the platform gets its end: a worker that
                # takes the turn over from here delivers nothing twice.
                await self.policy.partials.save_now(turn.id)
        progress.finish_reason = final.finish_reason
        if final.timings is not None:
            clock.add("queue", final.timings.queue_ms)
            clock.add("prefill", final.timings.prefill_ms)
            clock.add("decode", final.timings.decode_ms)
        if isinstance(sink, UsageAwareSink):
            sink.set_usage(
                usage(
                    progress.prompt_tokens,
                    progress.cached_tokens,
                    len(progress.generated) - progress.carried,
                )
            )
        with clock.measure("deliver"):
            await self._streams.append(turn.id, progress.text[len(progress.delivered) :])
            progress.delivered = progress.text
            await sink.finish(progress.text)

        # The reply is out: both entries join the token-exact history in the same
        # locked transaction as the final status (``TurnEndings.finish``), so a turn another
        # worker has taken over meanwhile adds nothing to the history.
        reply_seq = history.next_seq
        # A prepared compaction's base, stored with the turn's end (before the user entry).
        entries: list[Message] = list(progress.compaction_entries)
        if user is not None:
            entries.append(
                Message(
                    conversation_id=turn.conversation_id,
                    seq=history.next_seq,
                    parent_seq=history.head_seq,
                    role="user",
                    text=user.content,
                    token_ids=pack_token_ids(user.token_ids),
                    turn_id=turn.id,
                )
            )
            reply_seq += 1
        reply_ids = progress.generated
        if sampling.stop and final.finish_reason == "stop":
            # The history holds what the client was given (``ids_before_stop``).
            reply_ids = ids_before_stop(persona.chat_format, progress.generated, progress.text)
        entries.append(
            Message(
                conversation_id=turn.conversation_id,
                seq=reply_seq,
                parent_seq=entries[-1].seq if entries else history.head_seq,
                role="assistant",
                text=progress.text,
                token_ids=pack_token_ids(reply_ids),
                turn_id=turn.id,
            )
        )
        progress.history_entries = entries

    def _saving_partials(
        self, turn: Turn, progress: _Progress, sink: ReplySink
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Several workers: the reply so far goes to the turn row, for readers elsewhere and
        for a worker that takes the turn over if this one dies.

        A save refused because the turn is no longer this worker's (its lease ran out
        and another worker took it over) stops the generation: the reply must not go on
        in two places.
        """
        partials = self.policy.partials
        if partials is None:
            return contextlib.nullcontext()
        turn_id = turn.id

        def snapshot() -> ReplySnapshot:
            return ReplySnapshot(progress.text, tuple(progress.generated), delivery_of(sink))

        def saved(reply: ReplySnapshot) -> None:
            progress.saved = reply.text

        return partials.saving(
            turn_id,
            snapshot,
            on_lost=lambda: self.cancellations.request(turn_id),
            on_saved=saved,
            saved=ReplySnapshot(progress.saved, tuple(progress.generated), turn.delivery),
        )

    async def _deliver(self, turn_id: str, sink: ReplySink, progress: _Progress) -> None:
        """Give readers and the platform the reply so far: with several workers only what the
        row holds, so that a worker taking the turn over continues exactly from what the
        user has seen (docs/replies.md). The first text is saved at once."""
        partials = self.policy.partials
        shown = progress.text
        if partials is not None:
            if progress.text and not progress.saved:
                await partials.save_now(turn_id)
            shown = progress.saved
        if len(shown) <= len(progress.delivered):
            return
        await self._streams.append(turn_id, shown[len(progress.delivered) :])
        progress.delivered = shown
        await sink.delta(shown)

    def _user_turn(self, persona: PersonaChoice, history: History, content: str) -> UserTurn:
        chat_format = persona.chat_format
        if history.ends_with_base:
            return chat_format.turn_after_closed(content)
        if history.prompt_ids:
            return chat_format.next_turn(history.last_assistant_ids, content)
        # Only the first prompt holds the system prompt (the persona's): every later one
        # starts with these very ids.
        return chat_format.first_turn(content)

    def _fill(
        self, end: TurnEnd, clock: LayerClock, progress: _Progress, received_at: float
    ) -> None:
        """What the turn produced and how long each layer took, whichever way it ended."""
        end.text = progress.text
        end.prompt_tokens = progress.prompt_tokens
        end.cached_tokens = progress.cached_tokens
        end.completion_tokens = len(progress.generated) - progress.carried
        end.resumes = progress.resumed
        end.finish_reason = progress.finish_reason
        # A compaction written with the turn's end exists only if the turn is done.
        deferred_and_lost = progress.compaction_write is not None and end.status != TurnStatus.DONE
        end.compaction_id = None if deferred_and_lost else progress.compaction_id
        end.coalesced = [turn.id for turn in progress.covered]
        ttft = (progress.first_token_at - received_at) * 1000 if progress.first_token_at else None
        end.timings_ms = timings_of(
            clock.rounded(),
            round(ttft, 3) if ttft is not None else None,
            round((time.time() - received_at) * 1000, 3),
        )
