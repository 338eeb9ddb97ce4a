"""Long conversations: the next base is prepared off the turns, and the switch finds it cached."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog
from sqlalchemy import select, update

from bot.config import EngineSettings
from bot.engine.base import GenerationChunk, GenerationRequest, InferenceEngine
from bot.engine.vllm_local import LocalVLLMEngine
from bot.errors import EngineError, ErrorClass
from bot.http.keys import TURNS
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.history import load_history
from bot.storage.models import Compaction, Conversation, Message, PreparedBase
from bot.storage.tokens import pack_token_ids, unpack_token_ids
from bot.turns.chat_format import ChatFormat
from bot.turns.compaction import Compactor
from bot.turns.preparation import digest
from tests.conftest import TEST_BLOCK_SIZE, TEST_MAX_MODEL_LEN, MakeClient, issue_key, make_settings
from tests.engine_spy import RecordingEngine
from tests.engines import PassThroughEngine
from tests.helpers import auth, load_turns, read_sse

HIGH = 0.5
PREPARE = 0.4
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


def _sections(**compaction: Any) -> dict[str, Any]:
    return {
        "generation": {"max_tokens": MAX_TOKENS, "temperature": 0.0, "top_p": 1.0},
        "compaction": {
            "high_watermark": HIGH,
            "low_watermark": LOW,
            "prepare_watermark": PREPARE,
            "summary_max_tokens": 16,
            **compaction,
        },
        "limits": {"messages_per_minute": 0, "tokens_per_day": 0},
    }


async def _say(client: Any, key: str, i: int, conversation: str = "long") -> None:
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": conversation, "message_id": f"m{i}", "text": LINES[i % 7]},
        headers={**auth(key), "Accept": "text/event-stream"},
    )
    events = await read_sse(response)
    assert events[-1].kind == "done", (i, events[-1])


async def _bases(db_url: str) -> dict[str, list[int]]:
    """Each compaction turn's base ids."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            rows = (
                await session.execute(
                    select(Message.turn_id, Message.token_ids).where(Message.role == "base")
                )
            ).all()
            return {turn_id: unpack_token_ids(ids) for turn_id, ids in rows}
    finally:
        await engine.dispose()


async def _compaction_turns(db_url: str) -> list[tuple[str, str]]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            rows = await session.execute(
                select(Compaction.id, Compaction.turn_id).order_by(Compaction.base_seq)
            )
            return [(compaction_id, turn_id) for compaction_id, turn_id in rows]
    finally:
        await engine.dispose()


async def _prepared(db_url: str) -> PreparedBase | None:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            return (await session.scalars(select(PreparedBase))).first()
    finally:
        await engine.dispose()


async def _until_prepared(db_url: str) -> PreparedBase:
    for _ in range(600):
        row = await _prepared(db_url)
        if row is not None and row.ready:
            return row
        await asyncio.sleep(0.05)
    raise AssertionError("no base was prepared")


async def test_the_switch_turn_finds_its_prepared_base_in_the_prefix_cache(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    turns = 40
    spy = RecordingEngine(engine)
    client = await make_client(db_url, engine_override=spy, **_sections())
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        for i in range(turns):
            await _say(client, key, i)
            # A user's pause: the background work of the turn (preparing the next base,
            # keeping it warm) is done before the next message; no turn waits for a warm-up.
            await _settled(client)

    rows = sorted(await load_turns(db_url), key=lambda turn: turn.seq)
    assert [row.status for row in rows] == ["done"] * turns
    bases = await _bases(db_url)
    compacted = [row for row in rows if row.compaction_id]
    assert len(compacted) >= 3, "the test must force several compactions"
    # Stored with each switch turn's end: its compaction row, its base, no prepared row left.
    assert await _compaction_turns(db_url) == [(row.compaction_id, row.id) for row in compacted]
    assert set(bases) == {row.id for row in compacted}
    lines = [line for line in logs if line["event"] == "compaction"]
    assert [line["turn_id"] for line in lines] == [row.id for row in compacted]
    assert all(line["prepared"] for line in lines), lines

    # Summaries and prefills ran off the turns, under their own request ids.
    by_id = {call.request.request_id: call for call in spy.calls}
    assert not any(rid.endswith(":summary") and not rid.startswith("prepare-") for rid in by_id)
    assert any(rid.startswith("prepare-") and rid.endswith(":prefill") for rid in by_id)
    high = HIGH * TEST_MAX_MODEL_LEN
    for row in rows:
        call = by_id[row.id]
        prompt = list(call.request.prompt_token_ids)
        assert len(prompt) + MAX_TOKENS <= high
    for row in compacted:
        call = by_id[row.id]
        base = bases[row.id]
        assert list(call.request.prompt_token_ids)[: len(base)] == base
        # The switch turn's base came whole blocks from the cache: it was prefilled before.
        assert call.final is not None and call.final.cached_tokens is not None
        assert call.final.cached_tokens >= len(base) // TEST_BLOCK_SIZE * TEST_BLOCK_SIZE, (
            row.id,
            call.final.cached_tokens,
            len(base),
        )
        # The compaction layer no longer waits for a summary.
        assert row.layer_ms["compact"] < 1000


def _is_warm_up(request: GenerationRequest) -> bool:
    """A prepared base's warm-up prefill (``Preparation._warm``'s request id)."""
    return request.request_id.startswith("prepare-") and request.request_id.endswith(":prefill")


async def _until_first_switch(client: Any, key: str, db_url: str, *, pause: bool) -> None:
    """Messages until a turn switches bases; ``pause``: wait for background work between."""
    for i in range(40):
        await _say(client, key, i)
        if pause:
            await _settled(client)
        if await _compaction_turns(db_url):
            return
    raise AssertionError("no turn switched bases in 40 turns")


class HeldWarmUps(PassThroughEngine):
    """The real engine; a prepared base's warm-up prefill is held back ``hold_s`` first."""

    def __init__(self, engine: InferenceEngine, hold_s: float) -> None:
        super().__init__(engine)
        self.hold_s = hold_s
        self.held = 0

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if _is_warm_up(request):
            self.held += 1
            await asyncio.sleep(self.hold_s)
        async for chunk in self._engine.generate(request):
            yield chunk


async def test_a_switch_turn_right_after_the_last_does_not_wait_for_the_warm_up(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    """Messages back to back: the previous turn's warm-up of the prepared base is still
    under way when the switch turn starts. The turn sends its prompt at once (the engine
    reuses whatever the warm-up has computed): its first token is not held up."""
    hold_s = 3.0
    held = HeldWarmUps(engine, hold_s)
    client = await make_client(db_url, engine_override=held, **_sections())
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        await _until_first_switch(client, key, db_url, pause=False)

    [(_, switch_id)] = await _compaction_turns(db_url)
    [line] = [line for line in logs if line["event"] == "compaction"]
    assert line["turn_id"] == switch_id and line["prepared"] is True
    assert held.held >= 2  # the fresh base's warm-up, then the previous turn's
    rows = {row.id: row for row in await load_turns(db_url)}
    assert all(row.status == "done" for row in rows.values())
    switch = rows[switch_id]
    assert switch.layer_ms["compact"] < hold_s * 1000 / 3, switch.layer_ms
    assert switch.layer_ms["ttft"] < hold_s * 1000 / 3, switch.layer_ms
    # It switched while warm-ups were under way: the last turns' are still held.
    assert _preparation(client)._warms


class FailingWarmUps(PassThroughEngine):
    """The real engine; a prepared base's warm-up prefill fails (the engine refuses it)."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if _is_warm_up(request):
            raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "connection refused (test)")
        async for chunk in self._engine.generate(request):
            yield chunk


async def test_failed_warm_ups_are_logged_and_the_switch_still_uses_the_prepared_base(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    client = await make_client(db_url, engine_override=FailingWarmUps(engine), **_sections())
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        await _until_first_switch(client, key, db_url, pause=True)

    [line] = [line for line in logs if line["event"] == "compaction"]
    assert line["prepared"] is True
    failed = [line for line in logs if line["event"] == "base_warm_failed"]
    assert failed and all("connection refused" in line["error"] for line in failed)
    assert not [line for line in logs if line["event"] == "base_preparation_failed"]
    assert all(turn.status == "done" for turn in await load_turns(db_url))


async def _prepared_from_other_ids(db_url: str, row: PreparedBase) -> None:
    """The row covers ids that are not the history's (prepared from another view of it).

    Entries are never rewritten in place (``Message``): what a row can be out of step
    with is the history it was prepared from, which ``covered_digest`` records.
    """
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            other = [7, *unpack_token_ids(row.token_ids or b"")]
            await session.execute(
                update(PreparedBase)
                .where(PreparedBase.conversation_id == row.conversation_id)
                .values(
                    token_ids=pack_token_ids(other),
                    covered_digest=digest([7] * row.covered_tokens),
                )
            )
    finally:
        await engine.dispose()


async def _crash_half_way(db_url: str, row: PreparedBase) -> None:
    """The preparation's worker died after claiming the row: never marked ready."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            await session.execute(
                update(PreparedBase)
                .where(PreparedBase.conversation_id == row.conversation_id)
                .values(ready=False)
            )
    finally:
        await engine.dispose()


async def _next_prompt_tokens(db_url: str, chat_format: ChatFormat, content: str) -> int:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            conversation_id = (await session.scalars(select(Conversation.id))).one()
            history = await load_history(session, conversation_id)
    finally:
        await engine.dispose()
    if history.ends_with_base:
        return len(history.prompt_ids) + len(chat_format.turn_after_closed(content).token_ids)
    user = chat_format.next_turn(history.last_assistant_ids, content)
    return len(history.prompt_ids) + len(user.token_ids)


@pytest.mark.parametrize("change", ["other-ids", "half-prepared"])
async def test_a_stale_or_half_prepared_base_is_not_used(
    db_url: str, make_client: MakeClient, chat_format: ChatFormat, change: str
) -> None:
    """The row changes just before the switch, which a worker that never rolled the base
    (a restarted one) meets: it goes on uncompacted while the prompt fits. A stale row is
    prepared again from the history; a half-prepared one, whose lease still runs, is left
    to its worker until a turn no longer fits, which compacts itself."""
    client = await make_client(db_url, **_sections())
    key = await issue_key(db_url)
    i = 0
    with structlog.testing.capture_logs() as logs:
        while await _prepared(db_url) is None:
            await _say(client, key, i)
            i += 1
            assert i < 30
        row = await _until_prepared(db_url)
        # Up to the turn that switches bases; the history changes just before it.
        while await _next_prompt_tokens(db_url, chat_format, LINES[i % 7]) + MAX_TOKENS <= (
            HIGH * TEST_MAX_MODEL_LEN
        ):
            await _say(client, key, i)
            i += 1
        assert not [line for line in logs if line["event"] == "compaction"]
        await _settled(client)
        await (_prepared_from_other_ids if change == "other-ids" else _crash_half_way)(db_url, row)
        await client.close()
        client = await make_client(db_url, **_sections())
        fits: dict[int, bool] = {}
        while not [line for line in logs if line["event"] == "compaction"]:
            prompt = await _next_prompt_tokens(db_url, chat_format, LINES[i % 7])
            fits[i] = prompt + MAX_TOKENS <= TEST_MAX_MODEL_LEN
            await _say(client, key, i)
            i += 1
            assert i < 80
    [line] = [line for line in logs if line["event"] == "compaction"]
    rows = sorted(await load_turns(db_url), key=lambda turn: turn.seq)
    assert all(turn.status == "done" for turn in rows)
    assert line["turn_id"] == rows[-1].id
    postponed = [line["turn_id"] for line in logs if line["event"] == "compaction_postponed"]
    assert postponed and postponed == [turn.id for turn in rows[min(fits) : -1]]
    if change == "other-ids":
        assert any(line["event"] == "prepared_base_stale" for line in logs)
        # Prepared again from the history, not from the row's other ids.
        assert line["prepared"] is True
        stale = [7, *unpack_token_ids(row.token_ids or b"")]
        assert (await _bases(db_url))[line["turn_id"]][: len(stale)] != stale
    else:
        # Never ready: the first turn that does not fit uncompacted compacts itself.
        assert line["prepared"] is False
        assert not fits[i - 1] and all(fits[n] for n in range(min(fits), i - 1))


class FailingTurnEngine(RecordingEngine):
    """The real engine; while ``fail_turns`` is set, a turn's request fails (engine down)."""

    fail_turns = False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if self.fail_turns and not request.request_id.startswith("prepare-"):
            raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "connection refused (test)")
        async for chunk in super().generate(request):
            yield chunk


async def test_a_failed_switch_turn_leaves_the_prepared_base_for_the_next_turn(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine, chat_format: ChatFormat
) -> None:
    spy = FailingTurnEngine(engine)
    client = await make_client(db_url, engine_override=spy, **_sections())
    key = await issue_key(db_url)
    i = 0
    with structlog.testing.capture_logs() as logs:
        while await _prepared(db_url) is None:
            await _say(client, key, i)
            i += 1
            assert i < 30
        row = await _until_prepared(db_url)
        while await _next_prompt_tokens(db_url, chat_format, LINES[i % 7]) + MAX_TOKENS <= (
            HIGH * TEST_MAX_MODEL_LEN
        ):
            await _say(client, key, i)
            i += 1
        spy.fail_turns = True
        response = await client.post(
            "/v1/messages",
            json={"conversation_id": "long", "message_id": f"m{i}", "text": LINES[i % 7]},
            headers={**auth(key), "Accept": "text/event-stream"},
        )
        events = await read_sse(response)
        assert events[-1].data.get("error_class") == "engine_unavailable"
        failed = sorted(await load_turns(db_url), key=lambda turn: turn.seq)[-1]
        assert failed.status == "failed" and failed.compaction_id is None
        # Nothing of the switch was written; the prepared base is still there, still ready.
        assert await _compaction_turns(db_url) == [] and await _bases(db_url) == {}
        kept = await _prepared(db_url)
        assert kept is not None and kept.ready and kept.claim == row.claim
        spy.fail_turns = False
        await _say(client, key, i + 1)
    lines = [line for line in logs if line["event"] == "compaction"]
    assert [line["prepared"] for line in lines] == [True, True]
    rows = sorted(await load_turns(db_url), key=lambda turn: turn.seq)
    assert rows[-1].compaction_id is not None
    assert await _compaction_turns(db_url) == [(rows[-1].compaction_id, rows[-1].id)]
    assert await _prepared(db_url) is None


@pytest.mark.postgres
async def test_one_worker_prepares_a_conversation_at_a_time(
    pg_url: str,
    engine: LocalVLLMEngine,
    engine_settings: EngineSettings,
    chat_format: ChatFormat,
) -> None:
    """Two workers finishing turns of one conversation at once: one claim wins."""
    db = create_engine(pg_url)
    sessions = create_sessionmaker(db)
    settings = make_settings(pg_url, engine_settings, **_sections())
    workers = [
        Compactor(
            settings=settings.compaction,
            chat_format=chat_format,
            engine=engine,
            generation=settings.generation,
            sessions=sessions,
        )
        for _ in range(2)
    ]
    try:
        async with sessions() as session, session.begin():
            conversation = Conversation(channel="api", owner="o", external_key="k")
            session.add(conversation)
            await session.flush()
            conversation_id = conversation.id
        async with sessions() as session:
            history = await load_history(session, conversation_id)
        claims = await asyncio.gather(
            *[
                worker._preparation._claim(conversation_id, f"claim{n}", None, history, -1)
                for n, worker in enumerate(workers)
            ]
        )
        assert sorted(claims) == [False, True]
        async with sessions() as session:
            row = await session.get(PreparedBase, conversation_id)
            assert row is not None and not row.ready
            assert row.claim == f"claim{claims.index(True)}"
            assert row.covered_digest == digest(history.prompt_ids)
        # A preparation replaces only the row it judged: a stale view loses.
        again = await asyncio.gather(
            workers[0]._preparation._claim(conversation_id, "x", "claim0", history, -1),
            workers[1]._preparation._claim(conversation_id, "y", "claim1", history, -1),
        )
        assert sorted(again) == [False, True]
    finally:
        await db.dispose()


async def _send(client: Any, key: str, text: str, message_id: str) -> str:
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": "long", "message_id": message_id, "text": text},
        headers=auth(key),
    )
    body = await response.json()
    events = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
    assert events[-1].kind == "done", (message_id, events[-1])
    return str(body["turn_id"])


async def _fork(client: Any, key: str, turn_id: str, action: str, **body: Any) -> str:
    response = await client.post(
        f"/v1/turns/{turn_id}/{action}", json=body or None, headers=auth(key)
    )
    assert response.status == 202, await response.text()
    new = await response.json()
    events = await read_sse(await client.get(new["stream_url"], headers=auth(key)))
    assert events[-1].kind == "done", (action, events[-1])
    return str(new["turn_id"])


async def _path_to_head(db_url: str) -> tuple[list[Message], int | None]:
    """The active branch's entries (root to head, through bases) and the head."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            conversation = (await session.scalars(select(Conversation))).one()
            entries = {
                entry.seq: entry
                for entry in await session.scalars(
                    select(Message).where(Message.conversation_id == conversation.id)
                )
            }
    finally:
        await engine.dispose()
    path: list[Message] = []
    seq = conversation.head_seq
    while seq is not None:
        path.insert(0, entries[seq])
        seq = entries[seq].parent_seq
    return path, conversation.head_seq


def _preparation(client: Any) -> Any:
    return client.app[TURNS].workers._runner.policy.compactor._preparation


async def _settled(client: Any) -> None:
    """Wait for this app's background preparations and warm-ups (they start as a turn ends)."""
    preparation = _preparation(client)
    for _ in range(100):
        await asyncio.sleep(0.02)
        pending = [*preparation._tasks.values(), *preparation._warms]
        if not pending:
            return
        await asyncio.gather(*pending, return_exceptions=True)
    raise AssertionError("background preparations did not settle")


def _marked(i: int) -> str:
    return f"{LINES[i % 7]} [turn-{i}]"


async def test_an_edit_of_the_prepared_turn_does_not_use_the_stale_base(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine, chat_format: ChatFormat
) -> None:
    """The edit forks above the entry the base was prepared up to: that base describes a
    branch no longer prompted, so the edit (which needs a compaction) rebuilds its own."""
    spy = RecordingEngine(engine)
    client = await make_client(db_url, engine_override=spy, **_sections())
    key = await issue_key(db_url)
    i = 0
    with structlog.testing.capture_logs() as logs:
        while await _prepared(db_url) is None:
            last = await _send(client, key, _marked(i), f"m{i}")
            await _settled(client)
            i += 1
            assert i < 30
        row = await _until_prepared(db_url)
        path, head = await _path_to_head(db_url)
        # Prepared up to the last reply: the turn just before it is the one to edit.
        assert row.head_seq == head and path[-1].turn_id == last
        prepared_turn = i - 1
        fork_seq = path[-2].parent_seq
        assert fork_seq is not None and path[-2].role == "user"

        # An edit too long to go on uncompacted from the fork point: it compacts.
        engine_db = create_engine(db_url)
        try:
            async with create_sessionmaker(engine_db)() as session:
                conversation_id = (await session.scalars(select(Conversation.id))).one()
                forked = await load_history(session, conversation_id, at=fork_seq)
        finally:
            await engine_db.dispose()
        words = 1
        while True:
            edited = "EDITED " + " ".join(["river"] * words)
            user = chat_format.next_turn(forked.last_assistant_ids, edited)
            # Past the window uncompacted, so the edit cannot go on without a new base.
            if len(forked.prompt_ids) + len(user.token_ids) + MAX_TOKENS > TEST_MAX_MODEL_LEN:
                break
            words += 8
        edit_id = await _fork(client, key, last, "edit", text=edited)

    [line] = [line for line in logs if line["event"] == "compaction"]
    assert line["turn_id"] == edit_id
    assert line["prepared"] is False
    assert any(line["event"] == "prepared_base_stale" for line in logs)
    left = await _prepared(db_url)
    assert left is None or left.claim != row.claim

    # The model saw the new branch: the base rebuilt from the fork point, then the edit.
    calls = {call.request.request_id: call for call in spy.calls}
    prompt = list(calls[edit_id].request.prompt_token_ids)
    shown = chat_format.decode(prompt)
    assert edited in shown
    assert f"[turn-{prepared_turn}]" not in shown
    stale = unpack_token_ids(row.token_ids or b"")
    assert prompt[: len(stale)] != stale
    path, head = await _path_to_head(db_url)
    base, user_entry, reply = path[-3:]
    assert (base.role, user_entry.role, reply.role) == ("base", "user", "assistant")
    assert base.parent_seq == fork_seq and base.turn_id == edit_id
    assert prompt[: len(unpack_token_ids(base.token_ids))] == unpack_token_ids(base.token_ids)
    assert user_entry.text == edited and head == reply.seq
    assert all(turn.status == "done" for turn in await load_turns(db_url))


async def test_after_a_regeneration_the_base_is_prepared_again_from_the_new_branch(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine, chat_format: ChatFormat
) -> None:
    """A regeneration never compacts; it moves the head off the entry the base was
    prepared up to, so the base is prepared again, and the switch uses that one."""
    spy = RecordingEngine(engine)
    client = await make_client(db_url, engine_override=spy, **_sections())
    key = await issue_key(db_url)
    i = 0
    with structlog.testing.capture_logs() as logs:
        while await _prepared(db_url) is None:
            last = await _send(client, key, _marked(i), f"m{i}")
            await _settled(client)
            i += 1
            assert i < 30
        row = await _until_prepared(db_url)
        _, head = await _path_to_head(db_url)
        assert row.head_seq == head
        again = await _fork(client, key, last, "regenerate")
        for _ in range(600):
            fresh = await _until_prepared(db_url)
            if fresh.claim != row.claim:
                break
            await asyncio.sleep(0.05)
        path, head = await _path_to_head(db_url)
        # Prepared again from the regenerated reply, the head of the active branch.
        assert fresh.claim != row.claim and fresh.head_seq == head
        assert path[-1].turn_id == again and path[-1].seq != row.head_seq
        while not [line for line in logs if line["event"] == "compaction"]:
            await _send(client, key, _marked(i), f"m{i}")
            i += 1
            assert i < 40

    assert any(line["event"] == "prepared_base_stale" for line in logs)
    [line] = [line for line in logs if line["event"] == "compaction"]
    assert line["prepared"] is True and line["turn_id"] != again
    switch = {call.request.request_id: call for call in spy.calls}[line["turn_id"]]
    path, _ = await _path_to_head(db_url)
    [base] = [entry for entry in path if entry.role == "base"]
    ids = unpack_token_ids(base.token_ids)
    assert list(switch.request.prompt_token_ids)[: len(ids)] == ids
    # The base continues the regenerated branch: the regeneration's reply is above it.
    above = [entry.seq for entry in path if entry.seq < base.seq]
    assert path[-1].seq > base.seq and head in above
    assert all(turn.status == "done" for turn in await load_turns(db_url))
