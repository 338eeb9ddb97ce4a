"""``bot.serve.serve``: READY=1 once ready, watchdog pings, and the SIGTERM drain.

The server runs in this process on the shared engine and receives a real
SIGTERM (``os.kill`` of our own pid, caught by the loop's signal handler).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from bot.config import EngineSettings
from bot.serve import serve
from bot.turns.chat_format import ChatFormat
from tests.conftest import issue_key, make_settings
from tests.helpers import auth, load_turns, read_sse
from tests.ops.slow_engine import SlowEngine


class NotifyListener:
    """Stands in for systemd: reads $NOTIFY_SOCKET all along, as systemd does."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.messages: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.messages.append((await loop.sock_recv(self.sock, 4096)).decode())

    def start(self) -> None:
        self._task = asyncio.create_task(self._read())

    async def close(self) -> None:
        await asyncio.sleep(0.05)  # let the last datagrams in
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sock.close()


@pytest.fixture
async def notify_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[NotifyListener]:
    path = tmp_path / "notify.sock"
    listener = NotifyListener(path)
    listener.start()
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # 0.2 s: pings every 0.1 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    yield listener
    await listener.close()


async def start_server(
    settings: Any, engine: Any, chat_format: ChatFormat
) -> tuple[asyncio.Task[int], str, str]:
    ready: asyncio.Future[tuple[list[Any], list[Any]]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(
            settings,
            engine=engine,
            chat_format=chat_format,
            on_ready=lambda main, admin: ready.set_result((main, admin)),
        )
    )
    async with asyncio.timeout(30):
        main, admin = await asyncio.shield(ready)
    host, port = main[0][:2]
    admin_url = f"http://{admin[0][0]}:{admin[0][1]}" if admin else ""
    return task, f"http://{host}:{port}", admin_url


async def test_sigterm_cancels_what_outlives_the_grace_period_and_exits_0(
    sqlite_url: str,
    engine: Any,
    engine_settings: EngineSettings,
    chat_format: ChatFormat,
    notify_listener: NotifyListener,
) -> None:
    settings = make_settings(
        sqlite_url,
        engine_settings,
        server={"port": 0, "admin_port": 0, "shutdown_grace_s": 0.5},
        generation={"max_tokens": 200, "temperature": 0.0, "top_p": 1.0},
    )
    key = await issue_key(sqlite_url)
    # 200 tokens at 50 ms each: about 10 s, far beyond the 0.5 s grace.
    task, base, admin = await start_server(settings, SlowEngine(engine, delay_s=0.05), chat_format)
    async with aiohttp.ClientSession() as http:
        # The admin address serves the ops endpoints without a key.
        async with http.get(f"{admin}/readyz") as response:
            assert response.status == 200
        async with http.get(f"{admin}/metrics") as response:
            assert response.status == 200
        async with http.post(
            f"{base}/v1/messages",
            json={"conversation_id": "c", "message_id": "m", "text": "Tell me a story"},
            headers={**auth(key), "Accept": "text/event-stream"},
        ) as response:
            with structlog.testing.capture_logs() as logs:
                first = await response.content.readline()  # the reply has started
                assert first.startswith(b"id:") or first.startswith(b"event:")
                os.kill(os.getpid(), signal.SIGTERM)
                started = asyncio.get_running_loop().time()
                events = await read_sse(response)
                async with asyncio.timeout(15):
                    code = await task
                took = asyncio.get_running_loop().time() - started
    assert code == 0
    assert took < 5, f"drain took {took:.1f} s with a 0.5 s grace"
    # The reader got a clean end, not a cut connection.
    assert events[-1].kind == "error"
    assert events[-1].data["error_class"] == "cancelled"
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "failed" and turn.error_class == "cancelled"
    assert 0 < (turn.completion_tokens or 0) < 200
    drained = [line for line in logs if line["event"] == "drain_finished"]
    assert drained and drained[0]["cancelled"] == 1 and drained[0]["in_flight"] == 1

    await notify_listener.close()
    messages = notify_listener.messages
    assert messages[0].startswith("STATUS=starting")
    assert any(message.startswith("READY=1") for message in messages)
    assert "WATCHDOG=1" in messages
    assert messages[-1].startswith("STOPPING=1")
    assert messages.index("WATCHDOG=1") > [m[:7] for m in messages].index("READY=1")


async def test_sigterm_lets_a_turn_finish_within_the_grace_period(
    sqlite_url: str,
    engine: Any,
    engine_settings: EngineSettings,
    chat_format: ChatFormat,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    settings = make_settings(
        sqlite_url, engine_settings, server={"port": 0, "shutdown_grace_s": 20.0}
    )
    key = await issue_key(sqlite_url)
    # 32 tokens at 20 ms: well under a second, well inside the grace period.
    task, base, _ = await start_server(settings, SlowEngine(engine, delay_s=0.02), chat_format)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{base}/v1/messages",
            json={"conversation_id": "c", "message_id": "m", "text": "Hi"},
            headers=auth(key),
        ) as response:
            assert response.status == 202
            stream_url = (await response.json())["stream_url"]
        async with http.get(f"{base}{stream_url}", headers=auth(key)) as response:
            await response.content.readline()
            os.kill(os.getpid(), signal.SIGTERM)
            events = await read_sse(response)
        async with asyncio.timeout(20):
            assert await task == 0
        # Stopped accepting: the port is closed.
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(f"{base}/healthz")
    assert events[-1].kind == "done"
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "done"
