"""``/v1/chat/completions`` through the real ``openai`` SDK: real app, real vLLM, both databases."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from sqlalchemy import select

from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation, OpenAIExchange
from tests.conftest import MakeClient, issue_key
from tests.helpers import load_turns
from tests.openai.helpers import DEMO_MODEL, USER_MESSAGES, cacheable, sdk


async def test_non_streamed_completion(db_url: str, make_client: MakeClient) -> None:
    client = await make_client(db_url)
    api = sdk(client, await issue_key(db_url))
    completion = await api.chat.completions.create(
        model=DEMO_MODEL,
        messages=[{"role": "user", "content": "Hello there!"}],
        temperature=0.2,
        max_tokens=50,
    )
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in {"stop", "length"}
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.completion_tokens > 0
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    (turn,) = await load_turns(db_url)
    assert turn.channel == "openai"
    assert turn.status == "done"
    assert turn.reply_text == choice.message.content
    assert completion.id == f"chatcmpl-{turn.id}"


async def test_streamed_completion_with_usage(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    stream = await api.chat.completions.create(
        model=DEMO_MODEL,
        messages=[{"role": "user", "content": "Stream to me."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in {"stop", "length"} and set(finishes[:-1]) == {None}
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    (turn,) = await load_turns(sqlite_url)
    assert text == turn.reply_text
    assert usage_chunk.usage.completion_tokens == turn.completion_tokens
    assert usage_chunk.usage.prompt_tokens == turn.prompt_tokens


async def test_stream_without_usage_option_sends_no_usage(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    stream = await api.chat.completions.create(
        model=DEMO_MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert chunks and all(chunk.choices and chunk.usage is None for chunk in chunks)


async def _conversation_rows(db_url: str) -> list[Conversation]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            return list((await session.scalars(select(Conversation))).all())
    finally:
        await engine.dispose()


async def test_full_text_resent_each_turn_continues_token_exactly(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    api = sdk(client, await issue_key(db_url))
    messages: list[Any] = [{"role": "system", "content": "Be brief."}]
    usages = []
    for text in USER_MESSAGES:
        messages.append({"role": "user", "content": text})
        stream = await api.chat.completions.create(
            model=DEMO_MODEL,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].usage is not None
        usages.append(chunks[-1].usage)
        # What any client does: send back the text it was given.
        messages.append({"role": "assistant", "content": reply})

    for turn, (previous, current) in enumerate(itertools.pairwise(usages), start=2):
        details = current.prompt_tokens_details
        assert details is not None and details.cached_tokens is not None
        expected = cacheable(previous.prompt_tokens, previous.completion_tokens)
        assert details.cached_tokens >= expected, (turn, details.cached_tokens, expected)
        assert current.prompt_tokens > previous.prompt_tokens + previous.completion_tokens

    (conversation,) = await _conversation_rows(db_url)
    assert conversation.channel == "openai"
    turns = await load_turns(db_url)
    assert len(turns) == len(USER_MESSAGES)
    assert {turn.conversation_id for turn in turns} == {conversation.id}
    # The system message reached the model as part of the first user turn.
    first = min(turns, key=lambda turn: turn.seq)
    assert first.user_text == f"Be brief.\n\n{USER_MESSAGES[0]}"


async def test_history_not_stored_here_starts_a_conversation_with_it(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    foreign = [
        {"role": "user", "content": "My name is Zoltan."},
        {"role": "assistant", "content": "Nice to meet you, Zoltan."},
        {"role": "user", "content": "What is my name?"},
    ]
    first = await api.chat.completions.create(model=DEMO_MODEL, messages=foreign)
    assert first.usage is not None
    reply = first.choices[0].message.content or ""
    follow_up = [
        *foreign,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Ok"},
    ]
    second = await api.chat.completions.create(model=DEMO_MODEL, messages=follow_up)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    expected = cacheable(first.usage.prompt_tokens, first.usage.completion_tokens)
    assert second.usage.prompt_tokens_details.cached_tokens is not None
    assert second.usage.prompt_tokens_details.cached_tokens >= expected
    # The second request continued the conversation the first one started.
    assert len(await _conversation_rows(sqlite_url)) == 1


async def test_branching_from_an_earlier_reply_starts_a_new_conversation(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    messages: list[Any] = [{"role": "user", "content": "One"}]
    first = await api.chat.completions.create(model=DEMO_MODEL, messages=messages)
    messages.append({"role": "assistant", "content": first.choices[0].message.content})
    await api.chat.completions.create(
        model=DEMO_MODEL, messages=[*messages, {"role": "user", "content": "Two"}]
    )
    # The same history again with another new message: the stored conversation has moved on.
    await api.chat.completions.create(
        model=DEMO_MODEL, messages=[*messages, {"role": "user", "content": "Two, edited"}]
    )
    conversations = await _conversation_rows(sqlite_url)
    assert len(conversations) == 2
    turns = await load_turns(sqlite_url)
    assert sorted(len([t for t in turns if t.conversation_id == c.id]) for c in conversations) == [
        1,
        2,
    ]


async def test_another_owner_never_continues_a_conversation(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    alice = sdk(client, await issue_key(sqlite_url, "alice"))
    bob = sdk(client, await issue_key(sqlite_url, "bob"))
    messages: list[Any] = [{"role": "user", "content": "Secret plan"}]
    first = await alice.chat.completions.create(model=DEMO_MODEL, messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Go on"},
    ]
    await bob.chat.completions.create(model=DEMO_MODEL, messages=messages)
    conversations = await _conversation_rows(sqlite_url)
    assert sorted(c.owner for c in conversations) == ["key:alice", "key:bob"]


async def test_exchanges_are_recorded_per_turn(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    await api.chat.completions.create(
        model=DEMO_MODEL, messages=[{"role": "user", "content": "Hi"}]
    )
    engine = create_engine(sqlite_url)
    try:
        async with create_sessionmaker(engine)() as session:
            rows = (await session.scalars(select(OpenAIExchange))).all()
    finally:
        await engine.dispose()
    (row,) = rows
    assert row.api == "chat.completions" and row.owner == "key:alice" and row.stored


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "assistant", "content": "Hi"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "Hi"}], "n": 2}, "n"),
        (
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "tools",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "x"}}],
                    }
                ]
            },
            "messages",
        ),
    ],
)
async def test_unsupported_requests_are_bad_requests(
    sqlite_url: str, make_client: MakeClient, body: dict[str, Any], param: str
) -> None:
    import openai

    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    with pytest.raises(openai.BadRequestError) as caught:
        await api.chat.completions.create(model=DEMO_MODEL, **body)
    assert caught.value.status_code == 400
    assert caught.value.param == param
    assert caught.value.code == "bad_request"
    assert await load_turns(sqlite_url) == []
