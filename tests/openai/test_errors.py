"""Refusals reach the ``openai`` SDK as its own exception types, with OpenAI error objects."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import MakeClient, issue_key
from tests.helpers import load_turns
from tests.openai.helpers import DEMO_MODEL, sdk

HELLO = [{"role": "user", "content": "Hello"}]


async def test_wrong_key_is_an_authentication_error(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    with pytest.raises(openai.AuthenticationError) as caught:
        await sdk(client, "sk-not-a-key").chat.completions.create(model=DEMO_MODEL, messages=HELLO)
    assert caught.value.code == "auth"
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == (
        "authentication_error"
    )
    with pytest.raises(openai.AuthenticationError):
        await sdk(client, "sk-not-a-key").models.list()


async def test_unknown_model_is_not_found(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    with pytest.raises(openai.NotFoundError) as caught:
        await api.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        await api.responses.create(model="gpt-4o", input="Hi")
    assert await load_turns(sqlite_url) == []


async def test_malformed_body_is_a_bad_request(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    with pytest.raises(openai.BadRequestError) as caught:
        await api.chat.completions.create(model=DEMO_MODEL, messages=[])
    assert caught.value.param == "messages"


async def test_text_over_the_limit_is_a_bad_request(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url, server={"max_text_chars": 10})
    api = sdk(client, await issue_key(sqlite_url))
    with pytest.raises(openai.BadRequestError):
        await api.chat.completions.create(
            model=DEMO_MODEL, messages=[{"role": "user", "content": "far more than ten"}]
        )
    assert await load_turns(sqlite_url) == []


async def test_over_the_fair_use_limit_is_a_rate_limit_error(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url, limits={"messages_per_minute": 2})
    api = sdk(client, await issue_key(db_url))
    for _ in range(2):
        await api.chat.completions.create(model=DEMO_MODEL, messages=HELLO)
    with pytest.raises(openai.RateLimitError) as caught:
        await api.chat.completions.create(
            model=DEMO_MODEL,
            messages=[
                {"role": "user", "content": "Earlier"},
                {"role": "assistant", "content": "A history this service never saw"},
                {"role": "user", "content": "Now"},
            ],
        )
    assert caught.value.code == "rate_limited"
    assert int(caught.value.response.headers["Retry-After"]) > 0
    # Nothing stored for the refused request, not even the history it brought.
    assert len(await load_turns(db_url)) == 2


async def test_context_overflow_is_a_bad_request_with_openais_code(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(
        sqlite_url, server={"max_text_chars": 100_000, "max_body_bytes": 1_000_000}
    )
    api = sdk(client, await issue_key(sqlite_url))
    with pytest.raises(openai.BadRequestError) as caught:
        await api.chat.completions.create(
            model=DEMO_MODEL, messages=[{"role": "user", "content": "word " * 3000}]
        )
    assert caught.value.code == "context_length_exceeded"
    (turn,) = await load_turns(sqlite_url)
    assert turn.error_class == "context_overflow"
