"""Messages that pile up while a reply is generating get one answer (chat.pending_messages)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from bot.engine.base import GenerationChunk, GenerationRequest
from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.helpers import auth, load_messages, load_turns, read_sse


class GatedEngine(RecordingEngine):
    """The real engine, but the first generation waits for ``release`` (messages pile up)."""

    def __init__(self, engine: LocalVLLMEngine) -> None:
        super().__init__(engine)
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if not self.started.is_set():
            self.started.set()
            await self.release.wait()
        async for chunk in super().generate(request):
            yield chunk


async def _post(client: Any, key: str, message_id: str, text: str) -> dict[str, Any]:
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": "c", "message_id": message_id, "text": text},
        headers=auth(key),
    )
    assert response.status == 202
    body: dict[str, Any] = await response.json()
    return body


async def test_messages_sent_during_a_reply_get_one_answer(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    gated = GatedEngine(engine)
    client = await make_client(db_url, engine_override=gated, chat={"pending_messages": "coalesce"})
    key = await issue_key(db_url)
    first = await _post(client, key, "m0", "First question.")
    await asyncio.wait_for(gated.started.wait(), 30)
    piled = [await _post(client, key, f"m{i}", f"Follow-up {i}.") for i in (1, 2, 3)]
    gated.release.set()
    await client.server.app[TURNS].wait_idle(timeout=60)

    # Two generations: the first message, then one answer for the three that piled up.
    assert len(gated.calls) == 2
    turns = {turn.id: turn for turn in await load_turns(db_url)}
    answering = turns[piled[0]["turn_id"]]
    assert turns[first["turn_id"]].status == "done"
    assert answering.status == "done" and answering.reply_text
    assert answering.coalesced_into is None
    for body in piled[1:]:
        covered = turns[body["turn_id"]]
        assert covered.status == "done"
        assert covered.coalesced_into == answering.id
        assert not covered.reply_text

    # The answering turn's user entry holds all three messages, in order.
    history = await load_messages(db_url, answering.conversation_id)
    assert [(role, turn_id) for role, _, turn_id in history] == [
        ("user", first["turn_id"]),
        ("assistant", first["turn_id"]),
        ("user", answering.id),
        ("assistant", answering.id),
    ]

    # A covered turn's stream ends with done + coalesced_into; so does its status document.
    events = await read_sse(await client.get(piled[2]["stream_url"], headers=auth(key)))
    assert events[-1].kind == "done"
    assert events[-1].data["coalesced_into"] == answering.id
    status = await (await client.get(f"/v1/turns/{piled[2]['turn_id']}", headers=auth(key))).json()
    assert status["status"] == "done" and status["coalesced_into"] == answering.id
    # The answering turn's done event lists what it covered.
    events = await read_sse(await client.get(piled[0]["stream_url"], headers=auth(key)))
    assert events[-1].kind == "done" and events[-1].data["text"] == answering.reply_text
    assert events[-1].data["coalesced"] == [piled[1]["turn_id"], piled[2]["turn_id"]]


async def test_coalesced_text_reaches_the_model_in_order(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine, chat_format: Any
) -> None:
    gated = GatedEngine(engine)
    client = await make_client(
        sqlite_url, engine_override=gated, chat={"pending_messages": "coalesce"}
    )
    key = await issue_key(sqlite_url)
    await _post(client, key, "m0", "Zero.")
    await asyncio.wait_for(gated.started.wait(), 30)
    await _post(client, key, "m1", "One.")
    await _post(client, key, "m2", "Two.")
    gated.release.set()
    await client.server.app[TURNS].wait_idle(timeout=60)
    prompt = chat_format.decode(gated.calls[1].request.prompt_token_ids)
    assert prompt.rstrip().endswith("One.\n\nTwo.<|im_end|>\n<|im_start|>assistant")


async def test_one_by_one_answers_every_message(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    gated = GatedEngine(engine)
    client = await make_client(
        sqlite_url, engine_override=gated, chat={"pending_messages": "one_by_one"}
    )
    key = await issue_key(sqlite_url)
    await _post(client, key, "m0", "Zero.")
    await asyncio.wait_for(gated.started.wait(), 30)
    await _post(client, key, "m1", "One.")
    await _post(client, key, "m2", "Two.")
    gated.release.set()
    await client.server.app[TURNS].wait_idle(timeout=60)
    assert len(gated.calls) == 3
    assert all(turn.coalesced_into is None for turn in await load_turns(sqlite_url))
