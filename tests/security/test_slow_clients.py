"""Slow clients are cut with 408 after a bound, however steadily they trickle bytes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from bot.app import create_app
from bot.config import EngineSettings
from bot.http.deadlines import LINGERING_S, app_runner
from bot.turns.chat_format import ChatFormat
from tests.conftest import issue_key, make_settings
from tests.helpers import count_rows

DEADLINE_S = 1.0
TRICKLE_S = 0.2
# Cut at the deadline, plus aiohttp's timer rounding and a busy machine's jitter.
CUT_WITHIN_S = DEADLINE_S + 2.0


@dataclass
class Served:
    port: int
    db_url: str


@pytest.fixture
async def served(
    sqlite_url: str, engine: Any, engine_settings: EngineSettings, chat_format: ChatFormat
) -> AsyncIterator[Served]:
    """The real app behind the runner ``botctl serve`` uses, on a loopback port."""
    settings = make_settings(
        sqlite_url,
        engine_settings,
        server={"header_timeout_s": DEADLINE_S, "body_timeout_s": DEADLINE_S},
    )
    app = await create_app(settings, engine=engine, chat_format=chat_format)
    runner = app_runner(app, settings.server, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Served(port, sqlite_url)
    finally:
        await runner.cleanup()


@dataclass
class Outcome:
    answer: bytes
    answered_after_s: float
    closed_after_s: float


async def trickle(port: int, head: bytes, slow: bytes) -> Outcome:
    """Send ``head`` at once, then ``slow`` a byte at a time; what came back, and when."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(head)

    async def drip() -> None:
        for byte in slow:
            await asyncio.sleep(TRICKLE_S)
            writer.write(bytes([byte]))
            await writer.drain()

    dripping = asyncio.create_task(drip())
    answer = b""
    answered_after = 0.0
    try:
        async with asyncio.timeout(CUT_WITHIN_S + LINGERING_S + 5):
            while chunk := await reader.read(4096):  # until the server closes
                answered_after = answered_after or time.monotonic() - started
                answer += chunk
    finally:
        dripping.cancel()
        writer.close()
    return Outcome(answer, answered_after, time.monotonic() - started)


async def test_a_trickled_request_head_gets_408(served: Served) -> None:
    out = await trickle(
        served.port, b"POST /v1/messages HTTP/1.1\r\n", b"Host: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    )
    assert out.answer.startswith(b"HTTP/1.1 408 "), out.answer
    assert b'"error": "timeout"' in out.answer
    assert DEADLINE_S * 0.9 <= out.answered_after_s <= CUT_WITHIN_S
    assert out.closed_after_s <= CUT_WITHIN_S


async def test_an_idle_connection_is_closed_without_an_answer(served: Served) -> None:
    out = await trickle(served.port, b"", b"")
    assert out.answer == b""
    assert out.closed_after_s <= CUT_WITHIN_S


async def test_a_trickled_body_gets_408_and_stores_nothing(served: Served) -> None:
    key = await issue_key(served.db_url)
    body = b'{"conversation_id": "c1", "message_id": "m1", "text": "' + b"a" * 100 + b'"}'
    head = (
        b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    out = await trickle(served.port, head + body[:10], body[10:])
    assert out.answer.startswith(b"HTTP/1.1 408 "), out.answer
    assert b'"error": "timeout"' in out.answer
    assert DEADLINE_S * 0.9 <= out.answered_after_s <= CUT_WITHIN_S
    # The rest of the body is read and dropped for a bounded time, then the line is cut.
    assert out.closed_after_s <= CUT_WITHIN_S + LINGERING_S
    assert set((await count_rows(served.db_url)).values()) == {0}


async def test_a_prompt_client_is_unaffected(served: Served) -> None:
    key = await issue_key(served.db_url)
    body = b'{"conversation_id": "c1", "message_id": "m1", "text": "hi"}'
    head = (
        b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    out = await trickle(served.port, head + body, b"")
    assert out.answer.startswith(b"HTTP/1.1 202 "), out.answer
