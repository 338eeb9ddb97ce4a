"""The real ``openai`` SDK pointed at the real app on loopback."""

from __future__ import annotations

from typing import Any

import openai
from aiohttp.test_utils import TestClient

from tests.conftest import TEST_BLOCK_SIZE

DEMO_MODEL = "demo-model"
"""What ``GET /v1/models`` lists for the test engine (the demo model's folder name)."""

USER_MESSAGES = [
    "Hello! How are you today?",
    "Tell me about the weather in Paris.",
    "And in Tokyo?",
    "What about 2026-11-30 at 12:30?",
    "**bold** and `code`, please.",
    "Ünïcödé and émojis 🙂 — café?",
    "Thanks, that is all.",
    "One more: a journey of a thousand miles.",
    "Why is the sky blue?",
    "Goodbye!",
]


_OPENED: list[openai.AsyncOpenAI] = []
"""SDK clients of the running test, closed after it (``conftest.py``)."""


def sdk(client: TestClient[Any, Any], key: str) -> openai.AsyncOpenAI:
    """An SDK client for the app; no retries, so a refusal is seen as it is."""
    api = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{client.server.port}/v1", api_key=key, max_retries=0
    )
    _OPENED.append(api)
    return api


async def close_sdk_clients() -> None:
    # An SDK client left to the garbage collector leaves its sockets to it too: a
    # ResourceWarning then fails whichever test happens to be running.
    while _OPENED:
        await _OPENED.pop().close()


def cacheable(prompt_tokens: int, completion_tokens: int) -> int:
    """Full blocks of the previous prompt + reply whose KV exists (the last token's never does)."""
    return (prompt_tokens + completion_tokens - 1) // TEST_BLOCK_SIZE * TEST_BLOCK_SIZE
