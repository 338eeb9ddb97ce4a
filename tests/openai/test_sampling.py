"""A client's own generation parameters reach vLLM, are stored with the turn, and hold.

Against the real engine (greedy unless asked): ``max_tokens`` caps the reply and
says ``length``; ``stop`` cuts the greedy reply exactly where the stop text began,
and the stored history holds what the client was given; the same ``seed`` at
temperature 1 repeats a reply and other seeds do not; a limit above the
server's ``generation.max_tokens`` is capped to it.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from sqlalchemy import select

from bot.engine.vllm_local import LocalVLLMEngine
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Message
from bot.storage.tokens import unpack_token_ids
from bot.turns.chat_format import ChatFormat
from tests.conftest import MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.helpers import load_turns
from tests.openai.helpers import DEMO_MODEL, sdk

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
SERVER_MAX_TOKENS = 32  # tests.conftest.make_settings


async def _assistant_entries(db_url: str) -> list[Message]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            rows = await session.scalars(
                select(Message).where(Message.role == "assistant").order_by(Message.id)
            )
            return list(rows.all())
    finally:
        await engine.dispose()


async def test_max_tokens_caps_the_reply_and_says_length(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    api = sdk(client, await issue_key(db_url))
    free = await api.chat.completions.create(model=DEMO_MODEL, messages=STORY)
    assert free.usage is not None and free.usage.completion_tokens > 3  # room to cut
    for limit in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        cut = await api.chat.completions.create(model=DEMO_MODEL, messages=STORY, **limit)
        assert cut.usage is not None and cut.usage.completion_tokens <= 3
        assert cut.choices[0].finish_reason == "length"
    stream = await api.chat.completions.create(
        model=DEMO_MODEL, messages=STORY, max_tokens=3, stream=True
    )
    finishes = [c.choices[0].finish_reason async for c in stream if c.choices]
    assert finishes[-1] == "length"
    response = await api.responses.create(
        model=DEMO_MODEL, input=STORY[0]["content"], max_output_tokens=3
    )
    assert response.status == "incomplete"
    assert response.usage is not None and response.usage.output_tokens <= 3
    turns = await load_turns(db_url)
    assert sorted((t.sampling or {}).get("max_tokens", 0) for t in turns) == [0, 3, 3, 3, 3]
    assert all(t.completion_tokens is not None and t.completion_tokens <= 3 for t in turns[1:])


async def test_a_limit_above_the_servers_is_capped(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    completion = await api.chat.completions.create(
        model=DEMO_MODEL, messages=STORY, max_tokens=10_000
    )
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= SERVER_MAX_TOKENS


async def test_stop_cuts_the_greedy_reply_where_the_stop_text_began(
    db_url: str, make_client: MakeClient, chat_format: ChatFormat
) -> None:
    client = await make_client(db_url)
    api = sdk(client, await issue_key(db_url))
    whole = (await api.chat.completions.create(model=DEMO_MODEL, messages=STORY)).choices[0]
    text = whole.message.content or ""
    assert len(text) > 12, text
    stop = text[8:11]
    begins = text.index(stop)
    assert begins > 0
    cut = await api.chat.completions.create(
        model=DEMO_MODEL, messages=STORY, stop=[stop, "\u2603never"]
    )
    assert cut.choices[0].message.content == text[:begins]
    assert cut.choices[0].finish_reason == "stop"
    # The stored history holds what the client was given, nothing of the stop text.
    entry = (await _assistant_entries(db_url))[-1]
    ids = unpack_token_ids(entry.token_ids)
    assert chat_format.tokenizer.decode(ids, skip_special_tokens=True) == text[:begins]
    # A client that sends it back continues that very conversation.
    follow = await api.chat.completions.create(
        model=DEMO_MODEL,
        messages=[
            *STORY,
            {"role": "assistant", "content": text[:begins]},
            {"role": "user", "content": "Go on."},
        ],
    )
    turns = await load_turns(db_url)
    follow_turn = next(t for t in turns if follow.id == f"chatcmpl-{t.id}")
    cut_turn = next(t for t in turns if cut.id == f"chatcmpl-{t.id}")
    assert follow_turn.conversation_id == cut_turn.conversation_id


async def test_the_same_seed_repeats_a_sampled_reply_and_other_seeds_differ(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))

    async def reply(seed: int) -> str:
        completion = await api.chat.completions.create(
            model=DEMO_MODEL, messages=STORY, temperature=1.0, seed=seed
        )
        return completion.choices[0].message.content or ""

    first = await reply(7)
    assert await reply(7) == first
    others = [await reply(seed) for seed in (1, 2, 3)]
    assert any(other != first for other in others), others


async def test_every_parameter_reaches_the_engine(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    spy = RecordingEngine(engine)
    client = await make_client(sqlite_url, engine_override=spy)
    api = sdk(client, await issue_key(sqlite_url))
    await api.chat.completions.create(
        model=DEMO_MODEL,
        messages=STORY,
        max_tokens=5,
        temperature=0.9,
        top_p=0.5,
        seed=11,
        stop="zz",
        presence_penalty=0.3,
        frequency_penalty=-0.2,
    )
    await api.responses.create(
        model=DEMO_MODEL, input="Hi", temperature=0.4, top_p=0.8, max_output_tokens=6
    )
    await api.chat.completions.create(model=DEMO_MODEL, messages=STORY)
    chat, responses, plain = (call.request for call in spy.calls)
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.seed) == (5, 0.9, 0.5, 11)
    assert (chat.stop, chat.presence_penalty, chat.frequency_penalty) == (("zz",), 0.3, -0.2)
    assert (responses.max_tokens, responses.temperature, responses.top_p) == (6, 0.4, 0.8)
    # Nothing asked: the server's [generation] settings (tests.conftest.make_settings).
    assert (plain.max_tokens, plain.temperature, plain.top_p, plain.seed, plain.stop) == (
        SERVER_MAX_TOKENS,
        0.0,
        1.0,
        None,
        (),
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": 2**64}, "seed"),
        ({"presence_penalty": 3}, "presence_penalty"),
    ],
)
async def test_parameters_it_cannot_honour_are_a_clear_400(
    sqlite_url: str, make_client: MakeClient, fields: dict[str, Any], param: str
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    with pytest.raises(openai.BadRequestError) as caught:
        await api.chat.completions.create(model=DEMO_MODEL, messages=STORY, **fields)
    assert caught.value.param is not None and caught.value.param.startswith(param)
    assert await load_turns(sqlite_url) == []
