"""A switch to the next base falls due while that base is still being prepared.

Messages back to back leave the background no time: the turn goes on with its
uncompacted prompt while that still fits the window, and waits for the base only
when it does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import structlog
from sqlalchemy import select

from bot.engine.base import BACKGROUND_PRIORITY, GenerationChunk, GenerationRequest
from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.history import load_history, path_entries
from bot.storage.models import BASE_ROLE, Conversation, Message, PreparedBase
from bot.storage.tokens import unpack_token_ids
from bot.turns.chat_format import ChatFormat
from tests.conftest import TEST_MAX_MODEL_LEN, MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.engines import PassThroughEngine
from tests.helpers import auth, load_turns, read_sse

HIGH = 0.85
PREPARE = 0.7
LOW = 0.4
MAX_TOKENS = 8
TURN_TIMEOUT_S = 30.0
"""A turn that waited for the held summary would wait for ever: fail it instead."""
LINES = [
    "Hello there, how are you?",
    "Tell me about the weather in Paris.",
    "What about 2026-11-30 at 12:30?",
    "Ünïcödé and émojis 🙂 — café?",
    "**bold** and `code`, please.",
    "A journey of a thousand miles.",
    "Numbers: 1 2 3 100 and more.",
]
SECTIONS: dict[str, Any] = {
    "generation": {"max_tokens": MAX_TOKENS, "temperature": 0.0, "top_p": 1.0},
    "compaction": {
        "high_watermark": HIGH,
        "low_watermark": LOW,
        "prepare_watermark": PREPARE,
        "summary_max_tokens": 16,
    },
    "limits": {"messages_per_minute": 0, "tokens_per_day": 0},
}


def _is_prepared_summary(request: GenerationRequest) -> bool:
    """The summary of a base prepared in the background (``Preparation``'s request id)."""
    return request.request_id.startswith("prepare-") and request.request_id.endswith(":summary")


class HeldSummaries(PassThroughEngine):
    """The real engine; a prepared base's summary starts only once ``release`` is set."""

    def __init__(self, engine: LocalVLLMEngine) -> None:
        super().__init__(engine)
        self.release = asyncio.Event()
        self.held: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if _is_prepared_summary(request):
            self.held.append(request)
            await self.release.wait()
        async for chunk in self._engine.generate(request):
            yield chunk


async def _say(client: Any, key: str, i: int) -> None:
    async with asyncio.timeout(TURN_TIMEOUT_S):
        response = await client.post(
            "/v1/messages",
            json={"conversation_id": "long", "message_id": f"m{i}", "text": LINES[i % 7]},
            headers={**auth(key), "Accept": "text/event-stream"},
        )
        events = await read_sse(response)
    assert events[-1].kind == "done", (i, events[-1])


async def _next_prompt_tokens(db_url: str, chat_format: ChatFormat, i: int) -> int:
    """The uncompacted prompt of message ``i``: the history's ids and its user turn."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            conversation_id = (await session.scalars(select(Conversation.id))).one()
            history = await load_history(session, conversation_id)
    finally:
        await engine.dispose()
    if history.ends_with_base:
        user = chat_format.turn_after_closed(LINES[i % 7])
    else:
        user = chat_format.next_turn(history.last_assistant_ids, LINES[i % 7])
    return len(history.prompt_ids) + len(user.token_ids)


async def _until_due(client: Any, key: str, db_url: str, chat_format: ChatFormat) -> int:
    """Messages back to back up to the one whose turn is due to switch bases; its index."""
    await _say(client, key, 0)
    i = 1
    while await _next_prompt_tokens(db_url, chat_format, i) + MAX_TOKENS <= (
        HIGH * TEST_MAX_MODEL_LEN
    ):
        await _say(client, key, i)
        i += 1
        assert i < 60
    return i


async def test_a_switch_due_before_its_base_is_ready_goes_on_uncompacted(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine, chat_format: ChatFormat
) -> None:
    held = HeldSummaries(engine)
    spy = RecordingEngine(held)
    client = await make_client(db_url, engine_override=spy, **SECTIONS)
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        i = await _until_due(client, key, db_url, chat_format)
        assert len(held.held) == 1, "the next base is being prepared, its summary held"
        assert held.held[0].priority == BACKGROUND_PRIORITY
        due: list[int] = []
        while len(due) < 2:
            prompt = await _next_prompt_tokens(db_url, chat_format, i)
            assert HIGH * TEST_MAX_MODEL_LEN < prompt + MAX_TOKENS <= TEST_MAX_MODEL_LEN
            await _say(client, key, i)
            due.append(i)
            i += 1
        assert not [line for line in logs if line["event"] == "compaction"]

        # The summary comes: the next turn switches to the prepared base.
        held.release.set()
        for _ in range(200):
            if not _preparation(client)._tasks:
                break
            await asyncio.sleep(0.05)
        await _say(client, key, i)

    rows = sorted(await load_turns(db_url), key=lambda turn: turn.seq)
    assert [row.status for row in rows] == ["done"] * len(rows)
    calls = {call.request.request_id: call for call in spy.calls}
    postponed = [line["turn_id"] for line in logs if line["event"] == "compaction_postponed"]
    assert postponed == [rows[n].id for n in due]
    for n in due:
        # Token-exact: the previous prompt and reply, then this turn's ids; no new base.
        before, after = calls[rows[n - 1].id], calls[rows[n].id]
        previous = [*before.request.prompt_token_ids, *before.generated]
        assert list(after.request.prompt_token_ids)[: len(previous)] == previous
        assert rows[n].compaction_id is None and rows[n].status == "done"
        assert after.request.priority == 0
    [line] = [line for line in logs if line["event"] == "compaction"]
    assert line["turn_id"] == rows[-1].id and line["prepared"] is True


async def test_a_turn_whose_prompt_no_longer_fits_waits_for_the_base(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine, chat_format: ChatFormat
) -> None:
    held = HeldSummaries(engine)
    client = await make_client(db_url, engine_override=held, **SECTIONS)
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        i = await _until_due(client, key, db_url, chat_format)
        while await _next_prompt_tokens(db_url, chat_format, i) + MAX_TOKENS <= (
            TEST_MAX_MODEL_LEN
        ):
            await _say(client, key, i)
            i += 1
        # Uncompacted, this one's prompt would not fit: it waits for the summary.
        waiting = asyncio.create_task(_say(client, key, i))
        await asyncio.sleep(1.0)
        assert not waiting.done()
        held.release.set()
        await waiting

    rows = sorted(await load_turns(db_url), key=lambda turn: turn.seq)
    assert [row.status for row in rows] == ["done"] * len(rows)
    [line] = [line for line in logs if line["event"] == "compaction"]
    assert line["turn_id"] == rows[-1].id and line["prepared"] is True
    assert rows[-1].layer_ms["compact"] >= 1000
    postponed = {line["turn_id"] for line in logs if line["event"] == "compaction_postponed"}
    assert rows[-2].id in postponed and rows[-1].id not in postponed


def _preparation(client: Any) -> Any:
    return client.app[TURNS].workers._runner.policy.compactor._preparation


async def _settled(client: Any) -> None:
    """Wait for this app's background preparations and warm-ups (they start as a turn ends)."""
    preparation = _preparation(client)
    for _ in range(200):
        await asyncio.sleep(0.02)
        pending = [*preparation._tasks.values(), *preparation._warms]
        if not pending:
            return
        await asyncio.gather(*pending, return_exceptions=True)
    raise AssertionError("background preparations did not settle")


async def _rolled_forward_from_the_row(db_url: str, chat_format: ChatFormat) -> list[int]:
    """The prepared row's ids, then the active path's entries since the one it was prepared
    up to: the first user entry re-rendered after a closed reply, the others id for id, and
    the last reply's closing."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            row = (await session.scalars(select(PreparedBase))).one()
            conversation = await session.get(Conversation, row.conversation_id)
            assert row.ready and row.token_ids is not None and conversation is not None
            assert conversation.head_seq is not None and row.head_seq is not None
            path = await path_entries(session, conversation.id, conversation.head_seq)
    finally:
        await engine.dispose()
    since = [entry for entry in path if entry.seq > row.head_seq]
    assert len(since) >= 4, "the test needs exchanges after the prepared ones"
    ids = unpack_token_ids(row.token_ids)
    ids += chat_format.turn_after_closed(since[0].text).token_ids
    for entry in since[1:]:
        ids += unpack_token_ids(entry.token_ids)
    return ids + chat_format.closing_ids(unpack_token_ids(since[-1].token_ids))


async def test_the_switch_writes_the_prepared_base_rolled_forward_over_the_turns_since(
    db_url: str, make_client: MakeClient, chat_format: ChatFormat
) -> None:
    client = await make_client(db_url, **SECTIONS)
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        i = await _until_due(client, key, db_url, chat_format)
        await _settled(client)
        expected = await _rolled_forward_from_the_row(db_url, chat_format)
        await _say(client, key, i)

    [line] = [line for line in logs if line["event"] == "compaction"]
    assert line["prepared"] is True
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            [base] = await session.scalars(select(Message).where(Message.role == BASE_ROLE))
    finally:
        await engine.dispose()
    assert base.turn_id == line["turn_id"]
    assert unpack_token_ids(base.token_ids) == expected
