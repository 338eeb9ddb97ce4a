"""A reply continued from its saved token ids: after a broken engine stream, and on request
when it was cut at the length limit (``POST /v1/turns/{id}/continue``).

Real vLLM, real databases; the engine's stream is broken by a wrapper that raises the
error a killed replica behind a router gives (``engine_unavailable``) after a few tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.engine.base import GenerationChunk, GenerationRequest
from bot.engine.vllm_local import LocalVLLMEngine
from bot.errors import EngineError, ErrorClass
from bot.storage.models import TurnStatus
from bot.turns.chat_format import ChatFormat
from tests.conftest import MakeClient, issue_key
from tests.engines import PassThroughEngine
from tests.helpers import auth, load_messages, load_turns, read_sse, reply_text

GREEDY = {"max_tokens": 48, "temperature": 0.0, "top_p": 1.0}


class BreakingEngine(PassThroughEngine):
    """The real engine, whose stream breaks after ``after_tokens`` ids, ``breaks`` times
    (None: every time). Records every request it was given."""

    def __init__(self, engine: LocalVLLMEngine, after_tokens: int, breaks: int | None) -> None:
        super().__init__(engine)
        self.after_tokens = after_tokens
        self.breaks = breaks
        self.requests: list[GenerationRequest] = []
        self.streamed: list[list[int]] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        ids: list[int] = []
        self.streamed.append(ids)
        breaking = self.breaks is None or self.breaks > 0
        async for chunk in self._engine.generate(request):
            ids.extend(chunk.token_ids)
            yield chunk
            if breaking and len(ids) >= self.after_tokens and not chunk.finished:
                if self.breaks is not None:
                    self.breaks -= 1
                raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "replica went away")


async def post_and_read(client: Any, key: str, conversation: str, text: str) -> list[Any]:
    body = {"conversation_id": conversation, "message_id": "m1", "text": text}
    response = await client.post(
        "/v1/messages", json=body, headers={**auth(key), "Accept": "text/event-stream"}
    )
    return await read_sse(response)


async def test_a_broken_engine_stream_is_continued_token_exact_and_the_turn_ends_done(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    breaking = BreakingEngine(engine, after_tokens=6, breaks=1)
    client = await make_client(db_url, engine_override=breaking, generation=GREEDY)
    key = await issue_key(db_url)
    events = await post_and_read(client, key, "c-broken", "Tell me about rivers.")

    assert events[-1].kind == "done", events[-1]
    # Delivered once, in order: the deltas are exactly the final reply.
    assert reply_text(events) == events[-1].data["text"]
    offsets = [int(event.event_id) for event in events if event.kind == "delta"]
    assert offsets == sorted(set(offsets))
    # The second request carried the prompt and the ids streamed so far, id for id, and
    # asked only for the rest of the budget.
    first, second = breaking.requests
    assert list(second.prompt_token_ids) == [*first.prompt_token_ids, *breaking.streamed[0]]
    assert second.max_tokens == first.max_tokens - len(breaking.streamed[0])
    (turn,) = await load_turns(db_url)
    assert (turn.status, turn.resumes) == (TurnStatus.DONE, 1)
    assert turn.completion_tokens == len(breaking.streamed[0]) + len(breaking.streamed[1])
    reply_ids = (await load_messages(db_url, turn.conversation_id))[-1][1]
    assert reply_ids == [*breaking.streamed[0], *breaking.streamed[1]]

    # The same message, unbroken: the same reply (greedy, token-exact continuation).
    reference = await post_and_read(client, key, "c-whole", "Tell me about rivers.")
    assert reference[-1].data["text"] == events[-1].data["text"]


class EndLostEngine(PassThroughEngine):
    """The real engine, whose stream breaks once as its last ids arrive: they come, the
    final chunk does not (a replica killed between the two). Records every request."""

    def __init__(self, engine: LocalVLLMEngine) -> None:
        super().__init__(engine)
        self.requests: list[GenerationRequest] = []
        self.broke = False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        async for chunk in self._engine.generate(request):
            if chunk.finished and not self.broke:
                self.broke = True
                if chunk.token_ids:
                    yield GenerationChunk(chunk.token_ids, chunk.text)
                raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "replica went away")
            yield chunk


async def test_a_stream_broken_after_its_last_token_ends_done_without_asking_for_more(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    end_lost = EndLostEngine(engine)
    client = await make_client(
        db_url, engine_override=end_lost, generation={**GREEDY, "max_tokens": 6}
    )
    key = await issue_key(db_url)
    events = await post_and_read(client, key, "c-end-lost", "Tell me about rivers.")

    assert events[-1].kind == "done", events[-1]
    assert reply_text(events) == events[-1].data["text"]
    (turn,) = await load_turns(db_url)
    assert (turn.status, turn.completion_tokens) == (TurnStatus.DONE, 6)
    # Every id of the budget had come: nothing more was asked of the engine.
    assert len(end_lost.requests) == 1


async def test_an_engine_that_keeps_breaking_fails_the_turn_visibly_after_a_few_resumes(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    from bot.turns.resumption import MAX_ENGINE_RESUMES

    breaking = BreakingEngine(engine, after_tokens=2, breaks=None)
    client = await make_client(db_url, engine_override=breaking, generation=GREEDY)
    key = await issue_key(db_url)
    events = await post_and_read(client, key, "c-down", "Tell me about rivers.")

    assert events[-1].kind == "error"
    assert events[-1].data["error_class"] == "engine_unavailable"
    assert len(breaking.requests) == MAX_ENGINE_RESUMES + 1
    (turn,) = await load_turns(db_url)
    assert (turn.status, turn.error_class, turn.resumes) == (
        TurnStatus.FAILED,
        "engine_unavailable",
        MAX_ENGINE_RESUMES,
    )


async def test_continue_carries_on_a_cut_reply_token_exact(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    client = await make_client(
        db_url, generation={"max_tokens": 12, "temperature": 0.0, "top_p": 1.0}
    )
    key = await issue_key(db_url)
    cut = await post_and_read(client, key, "c-cut", "Hello there!")
    assert cut[-1].data["finish_reason"] == "length"
    (first,) = await load_turns(db_url)
    cut_turn_id = first.id
    cut_text = cut[-1].data["text"]

    accepted = await client.post(f"/v1/turns/{cut_turn_id}/continue", headers=auth(key))
    assert accepted.status == 202, await accepted.text()
    body = await accepted.json()
    assert body["continued_chars"] == len(cut_text)
    stream = await client.get(
        body["stream_url"], headers={**auth(key), "Last-Event-ID": str(len(cut_text))}
    )
    events = await read_sse(stream)
    assert events[-1].kind == "done", events[-1]
    whole = events[-1].data["text"]
    assert whole.startswith(cut_text) and len(whole) > len(cut_text)
    # Only the new text streams after the cut one; nothing of it twice.
    assert cut_text + reply_text(events) == whole

    history = await load_messages(db_url, first.conversation_id)
    replies = {turn_id: ids for role, ids, turn_id in history if role == "assistant"}
    assert replies[body["turn_id"]][: len(replies[cut_turn_id])] == replies[cut_turn_id]
    assert len(replies[body["turn_id"]]) > len(replies[cut_turn_id])
    turns = {turn.id: turn for turn in await load_turns(db_url)}
    continued = turns[body["turn_id"]]
    assert continued.status == TurnStatus.DONE
    assert continued.completion_tokens == len(replies[body["turn_id"]]) - len(replies[cut_turn_id])

    # A reply that was not cut cannot be continued.
    if continued.finish_reason != "length":
        refused = await client.post(f"/v1/turns/{continued.id}/continue", headers=auth(key))
        assert refused.status == 409


@pytest.mark.parametrize("text", ["Ünïcödé 😀 and 日本語 together", "🙂🙂🙂"])
def test_continued_text_completes_a_character_split_across_the_resume(
    chat_format: ChatFormat, text: str
) -> None:
    from bot.turns.resumption import ContinuedText

    tokenizer = chat_format.tokenizer
    prompt = chat_format.first_turn("hi").token_ids
    ids = tokenizer.encode(text, add_special_tokens=False)
    splits = [
        k
        for k in range(1, len(ids))
        if tokenizer.decode(ids[:k], skip_special_tokens=True).endswith("\ufffd")
    ]
    assert splits, "the tokenizer splits no character across ids: pick another text"
    for k in splits:
        given = tokenizer.decode(ids[:k], skip_special_tokens=True).rstrip("\ufffd")
        continued = ContinuedText.after(tokenizer, prompt, ids[:k], given)
        assert continued.text(ids[:k]) == given
        assert continued.text(ids, final=True) == tokenizer.decode(ids, skip_special_tokens=True)
