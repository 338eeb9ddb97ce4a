"""Compaction: rebuild a long conversation's token-exact base once, instead of every turn.

Between compactions every prompt extends the previous prompt id for id
(``bot.turns.chat_format``), so vLLM serves the whole history from its prefix
cache. When the next prompt plus ``max_tokens`` would pass
``high_watermark * max_model_len``, the runner calls ``Compactor.compact``:

1. The exchanges (user message + reply) since the previous compaction's first
   kept exchange are split into the most recent whole exchanges that fit under
   ``low_watermark * max_model_len`` (with the new user turn, ``max_tokens``
   and room for a summary) and the older ones, which are dropped. At least one
   is dropped, so a compaction always makes room.
2. Optionally (``compaction.summary``) the model summarises the previous
   summary plus the dropped exchanges, in a separate request.
3. System prompt + summary + kept exchanges are rendered with the chat template
   once and stored as a ``base`` history entry with a ``compactions`` row. From
   then on the history is that base plus the entries after it
   (``bot.storage.history.load_history``).

The cache therefore breaks once per compaction (a rolling window breaks it on
every turn). Older entries stay stored; they are just no longer prompted.

Reasoning models: generated reasoning stays in the token-exact history between
compactions (the stored ids are never rewritten). At a compaction, replies are
re-rendered from their text; with ``reasoning = "drop"`` (or ``"auto"`` when
the tokenizer's vocabulary or the chat template contains the close tag, as
with Qwen3 and DeepSeek-R1) everything up to the last ``</think>`` is cut.
When the close tag is one token of the vocabulary the cut is made in the
stored ids, so it also works when the tag is a special token that
detokenization drops from the reply text; otherwise it is made in the text.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.engine.base import USER_PRIORITY, GenerationRequest, InferenceEngine
from bot.storage.history import History, path_entries
from bot.storage.models import (
    BASE_ROLE,
    Compaction,
    Conversation,
    Message,
    PreparedBase,
    Turn,
    TurnStatus,
    new_id,
)
from bot.storage.tokens import pack_token_ids, unpack_token_ids
from bot.turns.chat_format import ChatFormat, Tokenizer
from bot.turns.finished import FinishedTurn, InFinalWrite
from bot.turns.preparation import Plan, Preparation
from bot.turns.settings import CompactionSettings, GenerationSettings

log = structlog.get_logger("bot.compaction")

SUMMARY_HEADER = "Summary of the earlier conversation:"
SUMMARY_INSTRUCTION = (
    "You condense chat transcripts. Write a short summary of the conversation below for the "
    "assistant who continues it: facts, names, numbers, decisions and open questions. "
    "Merge it with the summary so far, if there is one. No preamble."
)
# Tokens kept free around the summary prompt's transcript (template overhead varies by model).
SUMMARY_PROMPT_MARGIN = 16


@dataclass(frozen=True)
class Exchange:
    """One user message and the reply to it, as text (what a rebuilt base re-renders)."""

    user_seq: int
    user: str
    assistant: str


@dataclass(frozen=True)
class Compacted:
    history: History
    compaction_id: str
    summary_tokens: int
    entries: Sequence[Message] = ()
    """A base not stored yet: stored with the turn's own entries, if the turn is done."""
    write: InFinalWrite | None = None
    """The rest of such a compaction, for the turn's final transaction."""


def strip_reasoning(text: str, open_tag: str, close_tag: str) -> str:
    """The answer part of a reply: what follows the last close tag.

    The open tag is often part of the generation prompt rather than the reply,
    so the close tag decides. A reply cut off inside its reasoning has no
    answer part: what precedes the open tag (usually nothing) is kept.
    """
    if close_tag and close_tag in text:
        return text.rsplit(close_tag, 1)[1].lstrip()
    if open_tag and open_tag in text:
        return text.split(open_tag, 1)[0].rstrip()
    return text


def tag_token_id(tokenizer: Tokenizer, tag: str) -> int | None:
    """The id of ``tag`` when the vocabulary holds it as one token (special or not)."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if not tag or not callable(get_vocab):
        return None
    vocab: Any = get_vocab()
    token_id = vocab.get(tag) if isinstance(vocab, dict) else None
    return token_id if isinstance(token_id, int) else None


def answer_ids(token_ids: Sequence[int], open_id: int | None, close_id: int | None) -> list[int]:
    """The answer part of a reply's ids: after the last close tag (as ``strip_reasoning``)."""
    ids = list(token_ids)
    if close_id is not None and close_id in ids:
        return ids[len(ids) - ids[::-1].index(close_id) :]
    if open_id is not None and open_id in ids:
        return ids[: ids.index(open_id)]
    return ids


def knows_reasoning_tags(tokenizer: Tokenizer, close_tag: str) -> bool:
    """Whether the model writes reasoning: its chat template or vocabulary has the close tag."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and close_tag in template:
        return True
    return tag_token_id(tokenizer, close_tag) is not None


def pair_exchanges(rows: Sequence[tuple[int, str, str, str | None]]) -> list[Exchange]:
    """(seq, role, text, turn_id) rows of one path, in order -> whole exchanges.

    A reply pairs with the user entry right before it on the path; its turn may
    differ (a regeneration answers an earlier turn's user entry again).
    """
    exchanges: list[Exchange] = []
    pending: tuple[int, str] | None = None
    for seq, role, text, _ in rows:
        if role == "user":
            pending = (seq, text)
        elif role == "assistant" and pending is not None:
            exchanges.append(Exchange(pending[0], pending[1], text))
            pending = None
        else:
            pending = None
    return exchanges


def _from_base(history: History, base_ids: list[int]) -> History:
    """The history a compaction of ``history`` leaves: its new base, right after the path."""
    return History(
        base_ids,
        [],
        history.next_seq + 1,
        ends_with_base=True,
        head_seq=history.next_seq,
        last_role=BASE_ROLE,
    )


class Compactor:
    def __init__(
        self,
        *,
        settings: CompactionSettings,
        chat_format: ChatFormat,
        engine: InferenceEngine,
        generation: GenerationSettings,
        sessions: async_sessionmaker[AsyncSession],
        read_sessions: async_sessionmaker[AsyncSession] | None = None,
    ) -> None:
        self._settings = settings
        self._format = chat_format
        self._engine = engine
        self._generation = generation
        self._sessions = sessions
        self._read_sessions = read_sessions or sessions
        """Reads: on SQLite these never take the write lock, which the next turn may need."""
        self.drops_reasoning = settings.reasoning == "drop" or (
            settings.reasoning == "auto"
            and knows_reasoning_tags(chat_format.tokenizer, settings.think_close_tag)
        )
        self._open_id = tag_token_id(chat_format.tokenizer, settings.think_open_tag)
        self._close_id = tag_token_id(chat_format.tokenizer, settings.think_close_tag)
        self._preparation = Preparation(
            settings=settings,
            chat_format=chat_format,
            engine=engine,
            sessions=sessions,
            read_sessions=self._read_sessions,
            plan=self.plan,
            reasoning_dropped=self.drops_reasoning,
        )
        self.after_turn = self._preparation.after_turn
        """A turn ended and stored its entries: roll the prepared base forward over them;
        past ``prepare_watermark``, prepare the next base in the background (opened by
        ``system_prompt``, the conversation's persona's; default: the format's)."""

    def needed(self, prompt_tokens: int, max_tokens: int) -> bool:
        high = self._settings.high_watermark * self._engine.max_model_len
        return self._settings.enabled and prompt_tokens + max_tokens > high

    async def close(self) -> None:
        await self._preparation.close()

    async def compact(
        self,
        *,
        conversation_id: str,
        turn_id: str,
        content: str,
        history: History,
        prompt_tokens: int,
        max_tokens: int,
        cache_salt: str | None,
        system_prompt: str | None = None,
    ) -> Compacted | None:
        """Rebuild and store the base, opened by ``system_prompt`` (the conversation's persona's;
        default: the format's): the prepared one if it is ready and fits, else one made now.

        ``prompt_tokens``: the turn's prompt without a compaction. While it still fits
        the window with ``max_tokens``, a turn whose prepared base is not ready goes on
        with it (the switch waits for a later turn); only one whose prompt no longer
        fits waits for the preparation, or compacts itself.

        None when the switch waits, when there is nothing to drop (a lone long message),
        or when the turn is already final (another worker took it over): then nothing
        is stored.
        """
        user_ids = self._format.turn_after_closed(content).token_ids
        fits = prompt_tokens + max_tokens <= self._engine.max_model_len
        plan = await self._preparation.take(conversation_id, history, wait=not fits)
        high = self._settings.high_watermark * self._engine.max_model_len
        if plan is not None and len(plan.base_ids) + len(user_ids) + max_tokens > high:
            log.info("prepared_base_too_long", conversation_id=conversation_id)
            plan = None
        if plan is None and fits and self._settings.prepare_ahead:
            # Compacting here would put the summary and the new base's prefill before
            # this turn's first token; the uncompacted prompt costs only its new tokens.
            log.info(
                "compaction_postponed",
                conversation_id=conversation_id,
                turn_id=turn_id,
                prompt_tokens=prompt_tokens,
                max_model_len=self._engine.max_model_len,
            )
            return None
        if plan is None:
            plan = await self.plan(
                conversation_id=conversation_id,
                request_key=turn_id,
                reserve=len(user_ids),
                max_tokens=max_tokens,
                cache_salt=cache_salt,
                head_seq=history.head_seq,
                system_prompt=system_prompt,
            )
        if plan is None:
            return None
        base_ids = plan.base_ids
        if plan.prepared:
            return self._deferred(conversation_id, turn_id, history, plan)

        async with self._sessions() as session, session.begin():
            # Fenced like the turn's final write: once another worker has taken the turn
            # over (our lease ran out), it is final, and the history is no longer ours.
            turn = await session.get(Turn, turn_id, with_for_update=True)
            if turn is None or turn.status in TurnStatus.FINAL:
                log.info("compaction_skipped", conversation_id=conversation_id, turn_id=turn_id)
                return None
            fields, base = self._rows(conversation_id, turn_id, history, plan)
            record = Compaction(**fields, created_at=dt.datetime.now(dt.UTC))
            session.add(record)
            session.add(base)
            if history.head_seq == await session.scalar(
                select(Conversation.head_seq).where(Conversation.id == conversation_id)
            ):
                # Built from the active branch: the base ends it, even if this turn fails.
                await session.execute(
                    update(Conversation)
                    .where(Conversation.id == conversation_id)
                    .values(head_seq=history.next_seq)
                )
            # Whatever was prepared described the history before this base.
            await session.execute(
                delete(PreparedBase).where(PreparedBase.conversation_id == conversation_id)
            )
            await session.flush()
            compaction_id = record.id
        self._log(conversation_id, turn_id, compaction_id, history, plan)
        return Compacted(_from_base(history, base_ids), compaction_id, plan.summary_tokens)

    def _deferred(
        self, conversation_id: str, turn_id: str, history: History, plan: Plan
    ) -> Compacted:
        """A prepared base, written with the turn's end: nothing is written before its prefill.

        If the turn does not end done, nothing is written: the history is unchanged and the
        prepared base still describes it, so the next turn switches to it instead.
        """
        fields, base = self._rows(conversation_id, turn_id, history, plan)
        compaction_id = fields["id"]

        async def write(session: AsyncSession, turn: FinishedTurn) -> None:
            if turn.status != TurnStatus.DONE:
                return
            # A fresh row per attempt: the final write may be retried after a rollback.
            session.add(Compaction(**fields, created_at=dt.datetime.now(dt.UTC)))
            await session.execute(
                delete(PreparedBase).where(PreparedBase.conversation_id == conversation_id)
            )

        self._log(conversation_id, turn_id, compaction_id, history, plan)
        return Compacted(
            _from_base(history, plan.base_ids),
            compaction_id,
            plan.summary_tokens,
            entries=[base],
            write=write,
        )

    def _rows(
        self, conversation_id: str, turn_id: str, history: History, plan: Plan
    ) -> tuple[dict[str, Any], Message]:
        """What a compaction stores: its ``compactions`` row's fields (a new id) and the base."""
        fields: dict[str, Any] = {
            "id": new_id(),
            "conversation_id": conversation_id,
            "turn_id": turn_id,
            "base_seq": history.next_seq,
            "kept_from_seq": plan.kept_from_seq,
            "summary": plan.summary,
            "dropped_exchanges": plan.dropped_exchanges,
            "kept_exchanges": plan.kept_exchanges,
            "tokens_before": len(history.prompt_ids),
            "tokens_after": len(plan.base_ids),
            "reasoning_dropped": self.drops_reasoning,
        }
        base = Message(
            conversation_id=conversation_id,
            seq=history.next_seq,
            # Below the entry it was built from: the tree stays connected, and the
            # prompt path restarts at the base (``bot.storage.history.path_entries``).
            parent_seq=history.head_seq,
            role=BASE_ROLE,
            text=self._format.decode(plan.base_ids),
            token_ids=pack_token_ids(plan.base_ids),
            turn_id=turn_id,
        )
        return fields, base

    def _log(
        self,
        conversation_id: str,
        turn_id: str,
        compaction_id: str,
        history: History,
        plan: Plan,
    ) -> None:
        # Sizes only: the summary and the turns are conversation content, not log material.
        log.info(
            "compaction",
            conversation_id=conversation_id,
            turn_id=turn_id,
            compaction_id=compaction_id,
            tokens_before=len(history.prompt_ids),
            tokens_after=len(plan.base_ids),
            dropped_exchanges=plan.dropped_exchanges,
            kept_exchanges=plan.kept_exchanges,
            summary_tokens=plan.summary_tokens,
            reasoning_dropped=self.drops_reasoning,
            prepared=plan.prepared,
        )

    async def plan(
        self,
        *,
        conversation_id: str,
        request_key: str,
        reserve: int,
        max_tokens: int,
        cache_salt: str | None,
        head_seq: int | None,
        system_prompt: str | None = None,
        priority: int = USER_PRIORITY,
    ) -> Plan | None:
        """The base a compaction of the path up to ``head_seq`` would write now, leaving
        ``reserve`` tokens for what follows, opened by ``system_prompt`` (default: the
        format's); its summary request scheduled at ``priority``.

        None when there is no whole exchange to work with.
        """
        async with self._read_sessions() as session:
            previous, exchanges = await self._load(session, conversation_id, head_seq)
        if not exchanges:
            return None
        system = self._format.system_prompt if system_prompt is None else system_prompt
        kept = self._fit(exchanges, reserve, max_tokens, system)
        dropped = exchanges[: len(exchanges) - len(kept)]

        summary = previous.summary if previous is not None else None
        summary_tokens = 0
        if self._settings.summary:
            summary, summary_tokens = await self._summarise(
                conversation_id, request_key, summary, dropped, cache_salt, priority
            )
        else:
            summary = None
        base_ids = self._format.render_ids(
            self._messages(system, summary, kept), add_generation_prompt=False
        )
        return Plan(
            base_ids=base_ids,
            summary=summary,
            summary_tokens=summary_tokens,
            kept_from_seq=kept[0].user_seq if kept else None,
            dropped_exchanges=len(dropped),
            kept_exchanges=len(kept),
        )

    # -- pieces ------------------------------------------------------------------------

    async def _load(
        self, session: AsyncSession, conversation_id: str, head_seq: int | None
    ) -> tuple[Compaction | None, list[Exchange]]:
        """The latest compaction on the path to ``head_seq``, and the exchanges it keeps going."""
        if head_seq is None:
            return None, []
        path = await path_entries(session, conversation_id, head_seq, through_bases=True)
        bases = [entry.seq for entry in path if entry.role == BASE_ROLE]
        previous = None
        if bases:
            previous = (
                await session.scalars(
                    select(Compaction)
                    .where(
                        Compaction.conversation_id == conversation_id,
                        Compaction.base_seq == bases[-1],
                    )
                    .limit(1)
                )
            ).first()
        # Everything before the previous base's first kept exchange lives on in its summary.
        start = 0
        if previous is not None:
            start = (
                previous.kept_from_seq if previous.kept_from_seq is not None else previous.base_seq
            )
        rows = [
            (
                entry.seq,
                entry.role,
                self._answer(entry.text, entry.token_ids)
                if entry.role == "assistant"
                else entry.text,
                entry.turn_id,
            )
            for entry in path
            if entry.seq >= start and entry.role in ("user", "assistant")
        ]
        return previous, pair_exchanges(rows)

    def _answer(self, text: str, packed_ids: bytes) -> str:
        """A stored reply as the rebuilt base shows it: without its reasoning, if so configured."""
        if not self.drops_reasoning:
            return text
        if self._close_id is None:
            return strip_reasoning(
                text, self._settings.think_open_tag, self._settings.think_close_tag
            )
        ids = answer_ids(unpack_token_ids(packed_ids), self._open_id, self._close_id)
        return self._format.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def _messages(
        self, system: str, summary: str | None, kept: Sequence[Exchange]
    ) -> list[dict[str, str]]:
        if summary:
            system = (
                f"{system}\n\n{SUMMARY_HEADER}\n{summary}"
                if system
                else f"{SUMMARY_HEADER}\n{summary}"
            )
        messages = [{"role": "system", "content": system}] if system else []
        for exchange in kept:
            messages.append({"role": "user", "content": exchange.user})
            messages.append({"role": "assistant", "content": exchange.assistant})
        return messages

    def _fit(
        self, exchanges: list[Exchange], reserve: int, max_tokens: int, system: str
    ) -> list[Exchange]:
        """The most recent whole exchanges under the low watermark; never all of them.

        ``reserve``: tokens that follow the base before the turn's generation (the user
        turn; for a prepared base, the exchanges still to come before the switch).
        """
        budget = (
            int(self._settings.low_watermark * self._engine.max_model_len) - reserve - max_tokens
        )
        if self._settings.summary:
            # Room for the summary still to be written, and for its header.
            budget -= self._settings.summary_max_tokens + len(self._encode(SUMMARY_HEADER)) + 2
        kept = 0
        # Rendering is linear in the history; a few dozen exchanges at most fit in any window.
        while kept + 1 < len(exchanges):
            candidate = exchanges[len(exchanges) - kept - 1 :]
            size = len(
                self._format.render_ids(
                    self._messages(system, None, candidate), add_generation_prompt=False
                )
            )
            if size > budget:
                break
            kept += 1
        return exchanges[len(exchanges) - kept :] if kept else []

    def _encode(self, text: str) -> list[int]:
        return list(self._format.tokenizer.encode(text, add_special_tokens=False))

    async def _summarise(
        self,
        conversation_id: str,
        request_key: str,
        previous: str | None,
        dropped: Sequence[Exchange],
        cache_salt: str | None,
        priority: int,
    ) -> tuple[str | None, int]:
        """The model's summary of the previous summary plus the dropped exchanges.

        On failure the previous summary stands: a compaction must not fail the turn.
        """
        if not dropped:
            return previous, 0
        limit = (
            self._engine.max_model_len - self._settings.summary_max_tokens - SUMMARY_PROMPT_MARGIN
        )
        head = f"Summary so far:\n{previous}\n\n" if previous else ""
        frame = self._format.render_ids(
            [{"role": "system", "content": SUMMARY_INSTRUCTION}, {"role": "user", "content": head}],
            add_generation_prompt=True,
        )
        budget = limit - len(frame)
        # The newest dropped exchanges matter most: when they do not all fit, the oldest go.
        lines: list[str] = []
        for exchange in reversed(dropped):
            line = f"User: {exchange.user}\nAssistant: {exchange.assistant}"
            cost = len(self._encode(line)) + 1
            if cost > budget:
                break
            lines.insert(0, line)
            budget -= cost
        if not lines:
            return previous, 0
        prompt = self._format.render_ids(
            [
                {"role": "system", "content": SUMMARY_INSTRUCTION},
                {"role": "user", "content": head + "Conversation:\n" + "\n".join(lines)},
            ],
            add_generation_prompt=True,
        )
        request = GenerationRequest(
            request_id=f"{request_key}:summary",
            prompt_token_ids=prompt,
            max_tokens=self._settings.summary_max_tokens,
            temperature=self._generation.temperature,
            top_p=self._generation.top_p,
            cache_salt=cache_salt,
            session_key=conversation_id,
            priority=priority,
        )
        text = ""
        generated = 0
        try:
            async for chunk in self._engine.generate(request):
                text += chunk.text
                generated += len(chunk.token_ids)
        except Exception as exc:
            log.warning(
                "compaction_summary_failed",
                request=request_key,
                error=f"{type(exc).__name__}: {exc}",
            )
            return previous, 0
        if self.drops_reasoning:
            text = strip_reasoning(
                text, self._settings.think_open_tag, self._settings.think_close_tag
            )
        return (text.strip() or previous), generated
