"""The real model through the whole service: it answers, and it remembers what it was told.

Greedy decoding makes these deterministic. The memory test is the semantic
proof of token-exact history: the name exists only in turn 1's stored ids, so
the model can use it in turn 3 only if those ids are what it sees.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import TEST_BLOCK_SIZE, MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.engines import PassThroughEngine
from tests.helpers import auth, read_sse, reply_text

pytestmark = pytest.mark.realmodel


async def ask(
    client: TestClient[Any, Any], key: str, conversation: str, message_id: str, text: str
) -> str:
    """Send one message over the HTTP API and read its streamed reply to the end."""
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": conversation, "message_id": message_id, "text": text},
        headers=auth(key),
    )
    body = await response.json()
    events = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
    assert events[-1].kind == "done", events[-1]
    return reply_text(events)


async def test_greedy_answer_contains_the_fact(
    sqlite_url: str, make_real_client: MakeClient
) -> None:
    client = await make_real_client(sqlite_url)
    key = await issue_key(sqlite_url)
    reply = await ask(client, key, "geo", "m1", "What is the capital of France?")
    assert "Paris" in reply, reply


async def test_a_fact_from_turn_one_is_used_in_turn_three(
    sqlite_url: str, make_real_client: MakeClient
) -> None:
    client = await make_real_client(sqlite_url)
    key = await issue_key(sqlite_url)
    await ask(client, key, "intro", "m1", "My name is Zoltan.")
    await ask(client, key, "intro", "m2", "What is the capital of France?")
    reply = await ask(client, key, "intro", "m3", "What is my name?")
    assert "Zoltan" in reply, reply
    # The control: without that history the model cannot know it.
    stranger = await ask(client, key, "fresh", "m4", "What is my name?")
    assert "Zoltan" not in stranger, stranger


async def test_prefix_reuse_with_the_real_chat_template(
    sqlite_url: str, make_real_client: MakeClient, real_engine: PassThroughEngine
) -> None:
    spy = RecordingEngine(real_engine)
    client = await make_real_client(sqlite_url, engine_override=spy)
    key = await issue_key(sqlite_url)
    questions = [
        "Hello! Who are you?",
        "Name three colours.",
        "Write a short list of two fruits in Markdown.",
        "Thanks!",
    ]
    for i, text in enumerate(questions):
        await ask(client, key, "reuse", f"m{i}", text)

    assert len(spy.calls) == len(questions)
    for previous, current in itertools.pairwise(spy.calls):
        before = list(previous.request.prompt_token_ids) + previous.generated
        assert list(current.request.prompt_token_ids)[: len(before)] == before
        assert current.final is not None and current.final.cached_tokens is not None
        # Every full block of the previous prompt + reply (the last token's KV never exists).
        cacheable = (len(before) - 1) // TEST_BLOCK_SIZE * TEST_BLOCK_SIZE
        assert current.final.cached_tokens == cacheable, (current.final.cached_tokens, cacheable)
