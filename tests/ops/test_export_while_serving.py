"""``botctl conversations export | slow-consumer`` while the service takes and answers messages.

The export runs as a real process whose stdout is a pipe nobody reads: once
the pipe is full it blocks in the middle of the export, for longer than
SQLite's busy timeout. Meanwhile the service must accept, answer, list and
report ready as usual. Before, the export held one transaction for its whole
run, and on SQLite every transaction took the write lock at BEGIN: the
service's writes waited the busy timeout out and failed ("database is locked").
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bot.app import create_app
from bot.config import EngineSettings
from bot.storage.db import SQLITE_BUSY_TIMEOUT_MS
from bot.storage.models import TurnStatus
from bot.turns.chat_format import ChatFormat
from tests.conftest import issue_key, make_settings
from tests.helpers import auth, load_turns, read_sse, wait_until
from tests.production_server import serving

CONVERSATIONS = 60
# About 1.4 KB a message, stored twice in each exported document (turn and history):
# the export outgrows a pipe's 64 KiB buffer several times over.
LONG_TEXT = "hello world " * 120
STALLED_FOR_S = SQLITE_BUSY_TIMEOUT_MS / 1000 + 2
WORKTREE = str(Path(__file__).resolve().parents[2])


async def chat(http: aiohttp.ClientSession, key: str, conversation: str, text: str) -> str:
    """Post a message, stream its reply; the final event's kind."""
    async with http.post(
        "/v1/messages",
        json={"conversation_id": conversation, "message_id": "m1", "text": text},
        headers={**auth(key), "Accept": "text/event-stream"},
    ) as response:
        events = await read_sse(response)
    return events[-1].kind


def blocked_on_pipe(pid: int) -> bool:
    """The process sleeps in a write to a full pipe (Linux: /proc/PID/wchan)."""
    try:
        return "pipe_write" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


async def test_an_export_into_a_stalled_consumer_never_fails_the_running_service(
    db_url: str, engine: Any, engine_settings: EngineSettings, chat_format: ChatFormat
) -> None:
    settings = make_settings(
        db_url,
        engine_settings,
        limits={"messages_per_minute": 0, "tokens_per_day": 0},
        server={"max_streams_per_key": 2 * CONVERSATIONS},
    )
    app = await create_app(settings, engine=engine, chat_format=chat_format)
    key = await issue_key(db_url)
    async with serving(app) as base, aiohttp.ClientSession(base) as http:
        seeded = await asyncio.gather(
            *(chat(http, key, f"seed-{i}", LONG_TEXT) for i in range(CONVERSATIONS))
        )
        assert set(seeded) == {"done"}

        export = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.cli",
            "conversations",
            "export",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={
                **os.environ,
                "BOT_DATABASE__URL": db_url,
                "PYTHONPATH": WORKTREE,
            },
        )
        try:
            await wait_until(lambda: blocked_on_pipe(export.pid), 60)
            # The consumer stalls; the service goes on answering all that time.
            answered: list[str] = []
            ready: list[int] = []
            stalled_since = time.monotonic()
            while time.monotonic() - stalled_since < STALLED_FOR_S:
                answered.append(await chat(http, key, f"live-{len(answered)}", "Hi there"))
                async with http.get("/v1/conversations/seed-0/turns", headers=auth(key)) as page:
                    assert page.status == 200
                async with http.get("/readyz") as response:
                    ready.append(response.status)
            assert blocked_on_pipe(export.pid), "the export finished early: the test proves nothing"
        finally:
            out, err = await export.communicate()  # the consumer catches up
        assert export.returncode == 0, err.decode()
        assert len(out.decode().splitlines()) == CONVERSATIONS
        print(
            f"\nwhile the export stalled {STALLED_FOR_S:.0f} s: "
            f"{len(answered)} turns, /readyz {ready}"
        )
        assert answered and set(answered) == {"done"}
        assert set(ready) == {200}
    turns = await load_turns(db_url)
    assert {turn.status for turn in turns} == {TurnStatus.DONE}
