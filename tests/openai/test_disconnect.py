"""A client that stops reading a streamed reply stops its turn (the engine request is aborted)."""

from __future__ import annotations

import asyncio

from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.helpers import load_turns
from tests.openai.helpers import DEMO_MODEL, sdk

LONG_REPLY_TOKENS = 900
"""Far more than the demo model writes before the client leaves."""


async def test_closing_the_stream_cancels_the_turn(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url, generation={"max_tokens": LONG_REPLY_TOKENS})
    api = sdk(client, await issue_key(sqlite_url))
    stream = await api.chat.completions.create(
        model=DEMO_MODEL, messages=[{"role": "user", "content": "Go on and on."}], stream=True
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    await stream.close()
    await asyncio.wait_for(client.app[TURNS].wait_idle(), 30)
    (turn,) = await load_turns(sqlite_url)
    assert turn.status == "failed" and turn.error_class == "cancelled"
    assert turn.completion_tokens is not None and turn.completion_tokens < LONG_REPLY_TOKENS
