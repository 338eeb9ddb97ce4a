"""Clients nobody here wrote: the ``openai`` SDK and LiteLLM's SDK against the running app.

Each client's own parameters are honoured (a token limit, a stop string, a seed),
streamed and not, through both APIs; every refusal reaches the client as that
client's own exception type for the status.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import STREAM_READERS
from tests.conftest import MakeClient, issue_key
from tests.engines import SlowEngine
from tests.helpers import admin_key, load_turns, wait_until
from tests.openai.helpers import DEMO_MODEL, sdk

# LiteLLM fetches a price list from the internet at import unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
# LiteLLM's own TypedDicts make pydantic warn when it builds a validator for them.
pytestmark = pytest.mark.filterwarnings("ignore:.*`ReadOnly` qualifier:UserWarning")


def _base(client: TestClient[Any, Any]) -> str:
    return f"http://127.0.0.1:{client.server.port}/v1"


@pytest.fixture
async def litellm_session() -> AsyncIterator[None]:
    litellm.telemetry = False
    litellm.num_retries = 0
    yield
    # LiteLLM keeps its HTTP clients in a module cache: close them with the test's loop.
    await litellm.close_litellm_async_clients()


async def test_openai_sdk_parameters_streamed_and_not(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    whole = await api.chat.completions.create(model=DEMO_MODEL, messages=STORY)
    text = whole.choices[0].message.content or ""
    stop = text[8:11]
    stream = await api.chat.completions.create(
        model=DEMO_MODEL, messages=STORY, stop=[stop], stream=True
    )
    chunks = [chunk async for chunk in stream]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text[: text.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    events = await api.responses.create(
        model=DEMO_MODEL, input=STORY[0]["content"], max_output_tokens=2, stream=True
    )
    final = [event async for event in events][-1]
    assert final.type == "response.incomplete"
    assert final.response.usage is not None and final.response.usage.output_tokens <= 2


async def test_openai_sdk_refusals_are_its_own_exceptions(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    api = sdk(client, key)
    with pytest.raises(openai.AuthenticationError):
        await sdk(client, "bot_0123456789ab_nope").chat.completions.create(
            model=DEMO_MODEL, messages=STORY
        )
    with pytest.raises(openai.PermissionDeniedError) as forbidden:
        await sdk(client, await admin_key(sqlite_url)).responses.create(
            model=DEMO_MODEL, input="Hi"
        )
    assert forbidden.value.code == "forbidden"
    with pytest.raises(openai.NotFoundError):
        await api.chat.completions.create(model="gpt-4o", messages=STORY)
    with pytest.raises(openai.BadRequestError):
        await api.chat.completions.create(model=DEMO_MODEL, messages=STORY, n=3)
    first = await api.responses.create(model=DEMO_MODEL, input="One")
    await api.responses.create(model=DEMO_MODEL, input="Two", previous_response_id=first.id)
    with pytest.raises(openai.ConflictError):
        await api.responses.create(model=DEMO_MODEL, input="2", previous_response_id=first.id)
    assert len(await load_turns(sqlite_url)) == 2  # the two responses


async def test_openai_streams_count_against_the_keys_stream_cap(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    slow = SlowEngine(engine, pause_s=0.2)
    client = await make_client(db_url, engine_override=slow, server={"max_streams_per_key": 1})
    api = sdk(client, await issue_key(db_url))
    held = await api.chat.completions.create(model=DEMO_MODEL, messages=STORY, stream=True)
    assert (await anext(aiter(held))).choices[0].delta.role == "assistant"
    over_the_cap: list[Callable[[], Awaitable[Any]]] = [
        lambda: api.chat.completions.create(model=DEMO_MODEL, messages=STORY, stream=True),
        lambda: api.responses.create(model=DEMO_MODEL, input="Hi", stream=True),
    ]
    for request in over_the_cap:
        with pytest.raises(openai.RateLimitError) as over:
            await request()
        assert over.value.code == "rate_limited"
    assert len(await load_turns(db_url)) == 1  # nothing stored for a refused stream
    slow.pause_s = 0
    async for _ in held:
        pass
    await wait_until(lambda: client.app[STREAM_READERS].count == 0, timeout_s=10)
    # The slot came back with the first stream's end (a non-streamed call never needs one).
    again = await api.chat.completions.create(model=DEMO_MODEL, messages=STORY, stream=True)
    assert [chunk async for chunk in again]


async def test_litellm_parameters_streamed_and_not(
    sqlite_url: str, make_client: MakeClient, litellm_session: None
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    common: dict[str, Any] = {
        "model": f"openai/{DEMO_MODEL}",
        "api_base": _base(client),
        "api_key": key,
    }
    cut = await litellm.acompletion(messages=STORY, max_tokens=3, **common)
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage.completion_tokens <= 3
    seeded = [
        (await litellm.acompletion(messages=STORY, temperature=1.0, seed=5, **common))
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]
    stream = await litellm.acompletion(messages=STORY, max_tokens=4, stream=True, **common)
    chunks = [chunk async for chunk in stream]
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    response = await litellm.aresponses(input="Hello there", max_output_tokens=3, **common)
    assert response.status == "incomplete"
    turns = await load_turns(sqlite_url)
    assert len(turns) == 5
    assert {(t.sampling or {}).get("seed") for t in turns} == {None, 5}


async def test_litellm_refusals_are_its_own_exceptions(
    sqlite_url: str, make_client: MakeClient, litellm_session: None
) -> None:
    client = await make_client(sqlite_url)
    base = _base(client)
    key = await issue_key(sqlite_url)

    async def complete(api_key: str, **fields: Any) -> Any:
        return await litellm.acompletion(
            model=f"openai/{fields.pop('model', DEMO_MODEL)}",
            api_base=base,
            api_key=api_key,
            messages=STORY,
            **fields,
        )

    with pytest.raises(litellm.AuthenticationError):
        await complete("bot_0123456789ab_nope")
    # LiteLLM maps no 403 of an OpenAI-compatible server to a type of its own.
    with pytest.raises(litellm.APIError) as forbidden:
        await complete(await admin_key(sqlite_url))
    assert forbidden.value.status_code == 403
    with pytest.raises(litellm.NotFoundError):
        await complete(key, model="gpt-4o")
    with pytest.raises(litellm.BadRequestError):
        await complete(key, temperature=9)
    assert await load_turns(sqlite_url) == []
