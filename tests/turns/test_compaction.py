"""Long conversations: compaction rebuilds the base once; the cache breaks once per compaction."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
from sqlalchemy import select

from bot.config import EngineSettings
from bot.engine.vllm_local import LocalVLLMEngine
from bot.storage.conversations import allocate_turn_seq
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.history import load_history
from bot.storage.models import BASE_ROLE, Compaction, Message, Turn
from bot.storage.tokens import unpack_token_ids
from bot.turns.chat_format import ChatFormat
from bot.turns.compaction import (
    Compactor,
    answer_ids,
    knows_reasoning_tags,
    pair_exchanges,
    strip_reasoning,
    tag_token_id,
)
from tests.conftest import (
    TEST_BLOCK_SIZE,
    TEST_MAX_MODEL_LEN,
    MakeClient,
    issue_key,
    make_settings,
)
from tests.engine_spy import RecordedGeneration, RecordingEngine
from tests.helpers import auth, load_turns, read_sse

HIGH = 0.5
LOW = 0.25
MAX_TOKENS = 8
LINES = [
    "Hello there, how are you?",
    "Tell me about the weather in Paris.",
    "What about 2026-11-30 at 12:30?",
    "Ünïcödé and émojis 🙂 — café?",
    "**bold** and `code`, please.",
    "A journey of a thousand miles.",
    "Numbers: 1 2 3 100 and more.",
]


def _compaction_sections(**compaction: Any) -> dict[str, Any]:
    """These tests cover compacting inside the turn (tests/test_base_preparation.py: ahead)."""
    compaction.setdefault("prepare_ahead", False)
    return {
        "generation": {"max_tokens": MAX_TOKENS, "temperature": 0.0, "top_p": 1.0},
        "compaction": {
            "high_watermark": HIGH,
            "low_watermark": LOW,
            "summary_max_tokens": 16,
            **compaction,
        },
        "limits": {"messages_per_minute": 0, "tokens_per_day": 0},
    }


async def _chat(client: Any, key: str, turns: int, conversation: str = "long") -> None:
    for i in range(turns):
        response = await client.post(
            "/v1/messages",
            json={"conversation_id": conversation, "message_id": f"m{i}", "text": LINES[i % 7]},
            headers={**auth(key), "Accept": "text/event-stream"},
        )
        events = await read_sse(response)
        assert events[-1].kind == "done", (i, events[-1])


async def _stored(db_url: str) -> tuple[list[Compaction], dict[str, list[int]]]:
    """Compactions in order, and each compaction turn's base ids."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            compactions = list(
                (await session.scalars(select(Compaction).order_by(Compaction.created_at))).all()
            )
            rows = (
                await session.execute(
                    select(Message.turn_id, Message.token_ids).where(Message.role == "base")
                )
            ).all()
            return compactions, {turn_id: unpack_token_ids(ids) for turn_id, ids in rows}
    finally:
        await engine.dispose()


def _cacheable(previous: RecordedGeneration) -> int:
    total = len(previous.request.prompt_token_ids) + len(previous.generated)
    return (total - 1) // TEST_BLOCK_SIZE * TEST_BLOCK_SIZE


@pytest.mark.parametrize("summary", [True, False], ids=["summary", "no-summary"])
async def test_hundreds_of_turns_never_fail_and_break_the_cache_once_per_compaction(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine, summary: bool
) -> None:
    turns = 300 if db_url.startswith("sqlite") and summary else 80
    spy = RecordingEngine(engine)
    client = await make_client(db_url, engine_override=spy, **_compaction_sections(summary=summary))
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        await _chat(client, key, turns)

    summaries = [c for c in spy.calls if c.request.request_id.endswith(":summary")]
    calls = [c for c in spy.calls if not c.request.request_id.endswith(":summary")]
    assert len(calls) == turns
    rows = sorted(await load_turns(db_url), key=lambda turn: turn.seq)
    assert [row.status for row in rows] == ["done"] * turns
    compactions, bases = await _stored(db_url)
    compacted_turns = [row.id for row in rows if row.compaction_id]
    assert len(compactions) >= 5, "the test must force several compactions"
    assert compacted_turns == [c.turn_id for c in compactions]
    assert len(summaries) == (len(compactions) if summary else 0)

    high = HIGH * TEST_MAX_MODEL_LEN
    breaks: list[str] = []
    base: list[int] = []
    for index, (row, call) in enumerate(zip(rows, calls, strict=True)):
        prompt = list(call.request.prompt_token_ids)
        assert len(prompt) + MAX_TOKENS <= high, (index, len(prompt))
        if row.id in bases:
            base = bases[row.id]
        # Every prompt starts with the conversation's current base.
        assert prompt[: len(base)] == base, index
        if index == 0:
            continue
        previous = calls[index - 1]
        before = list(previous.request.prompt_token_ids) + previous.generated
        if prompt[: len(before)] != before:
            breaks.append(row.id)
            continue
        # Between compactions the whole previous prompt + reply comes from the cache.
        assert call.final is not None and call.final.cached_tokens is not None
        assert call.final.cached_tokens >= 0.99 * _cacheable(previous), index
    assert breaks == compacted_turns

    for compaction in compactions:
        assert compaction.tokens_after < compaction.tokens_before
        assert compaction.dropped_exchanges >= 1
        assert (compaction.summary is not None) == summary
    lines = [line for line in logs if line["event"] == "compaction"]
    assert [line["compaction_id"] for line in lines] == [c.id for c in compactions]
    turn_lines = [line for line in logs if line["event"] == "turn" and "compaction_id" in line]
    assert [line["turn_id"] for line in turn_lines] == compacted_turns


async def test_without_compaction_the_long_chat_overflows(
    sqlite_url: str, make_client: MakeClient
) -> None:
    """The control: the same chat with compaction off fails once the window is full."""
    client = await make_client(sqlite_url, **_compaction_sections(enabled=False))
    key = await issue_key(sqlite_url)
    outcomes = []
    for i in range(60):
        response = await client.post(
            "/v1/messages",
            json={"conversation_id": "c", "message_id": f"m{i}", "text": LINES[i % 7]},
            headers={**auth(key), "Accept": "text/event-stream"},
        )
        events = await read_sse(response)
        outcomes.append(events[-1].data.get("error_class", "done"))
        if outcomes[-1] != "done":
            break
    assert outcomes[-1] == "context_overflow"


def test_reasoning_is_cut_at_the_close_tag() -> None:
    assert strip_reasoning("<think>a b</think>\n\nAnswer.", "<think>", "</think>") == "Answer."
    # The open tag may be in the generation prompt, not in the reply.
    assert strip_reasoning("plan...</think>Answer.", "<think>", "</think>") == "Answer."
    # Cut off while reasoning: no answer part.
    assert strip_reasoning("<think>still thinking", "<think>", "</think>") == ""
    assert strip_reasoning("Plain answer.", "<think>", "</think>") == "Plain answer."


def test_reasoning_tags_are_detected_from_the_tokenizer(chat_format: ChatFormat) -> None:
    tokenizer: Any = chat_format.tokenizer
    assert not knows_reasoning_tags(tokenizer, "</think>")
    reasoning = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    reasoning.add_tokens(["<think>", "</think>"])
    assert knows_reasoning_tags(reasoning, "</think>")


def test_reasoning_in_special_tokens_is_cut_in_the_ids(chat_format: ChatFormat) -> None:
    tokenizer: Any = chat_format.tokenizer
    reasoning = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    reasoning.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    open_id, close_id = tag_token_id(reasoning, "<think>"), tag_token_id(reasoning, "</think>")
    assert open_id is not None and close_id is not None
    reply = reasoning.encode("<think>pondering deeply</think>The answer.", add_special_tokens=False)
    # As vLLM detokenizes it the tags are gone: the text alone cannot tell reasoning apart.
    shown = reasoning.decode(reply, skip_special_tokens=True)
    assert "pondering" in shown and strip_reasoning(shown, "<think>", "</think>") == shown
    answer = answer_ids(reply, open_id, close_id)
    assert reasoning.decode(answer, skip_special_tokens=True).strip() == "The answer."
    # Cut off while still reasoning: no answer part.
    unfinished = reasoning.encode("<think>still pondering", add_special_tokens=False)
    assert answer_ids(unfinished, open_id, close_id) == []
    assert tag_token_id(tokenizer, "</think>") is None


def test_exchanges_pair_user_entries_with_their_reply() -> None:
    rows = [
        (0, "user", "u0", "t0"),
        (1, "assistant", "a0", "t0"),
        (2, "base", "b", "t1"),
        (3, "user", "u1", "t1"),
        (4, "assistant", "a1", "t1"),
    ]
    assert [(e.user_seq, e.user, e.assistant) for e in pair_exchanges(rows)] == [
        (0, "u0", "a0"),
        (3, "u1", "a1"),
    ]


@pytest.mark.parametrize("status", ["running", "failed"])
async def test_compaction_writes_only_while_its_turn_is_still_ours(
    sqlite_url: str,
    make_client: MakeClient,
    engine: LocalVLLMEngine,
    engine_settings: EngineSettings,
    chat_format: ChatFormat,
    status: str,
) -> None:
    # A short chat, with compaction off, gives the history something to drop.
    sections = _compaction_sections(enabled=False)
    client = await make_client(sqlite_url, **sections)
    await _chat(client, await issue_key(sqlite_url), 3)
    [first, *_] = await load_turns(sqlite_url)

    # The next turn: still running here, or failed by a worker that took it over.
    db = create_engine(sqlite_url)
    sessions = create_sessionmaker(db)
    try:
        async with sessions() as session, session.begin():
            conversation_id = first.conversation_id
            turn = Turn(
                conversation_id=conversation_id,
                seq=await allocate_turn_seq(session, conversation_id),
                channel="api",
                user_text=LINES[3],
                status=status,
            )
            session.add(turn)
        async with sessions() as session:
            history = await load_history(session, conversation_id)
        settings = make_settings(sqlite_url, engine_settings, **_compaction_sections(summary=False))
        compactor = Compactor(
            settings=settings.compaction,
            chat_format=chat_format,
            engine=engine,
            generation=settings.generation,
            sessions=sessions,
        )
        compacted = await compactor.compact(
            conversation_id=conversation_id,
            turn_id=turn.id,
            content=LINES[3],
            history=history,
            prompt_tokens=len(history.prompt_ids),
            max_tokens=MAX_TOKENS,
            cache_salt=None,
        )
        async with sessions() as session:
            stored = list(await session.scalars(select(Compaction)))
            bases = list(await session.scalars(select(Message).where(Message.role == BASE_ROLE)))
    finally:
        await db.dispose()

    if status == "running":
        assert compacted is not None and [c.turn_id for c in stored] == [turn.id]
        assert len(bases) == 1
    else:
        assert compacted is None and stored == [] and bases == []
