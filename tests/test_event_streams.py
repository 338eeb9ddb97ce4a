"""Event stream readers, served the way ``botctl serve`` serves them.

aiohttp's test server cancels a handler when its client disconnects; the
production runner does not (``handler_cancellation`` off). These tests serve
the real app with the production runner (``tests.production_server``) and
read with bare sockets, so a reader can leave the way a closed browser tab
does: without a word.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from sqlalchemy import event

from bot.app import create_app
from bot.config import EngineSettings
from bot.http.keys import STREAM_READERS, TURN_FOLLOWERS
from bot.storage.db import is_sqlite
from bot.turns.chat_format import ChatFormat
from tests.conftest import issue_key, make_settings
from tests.engines import GatedEngine
from tests.helpers import admin_key, app_sync_engines, auth, count_rows, read_sse, wait_until
from tests.ops.helpers import samples, value
from tests.production_server import serving

READERS = 500
OPENING_AT_ONCE = 50
RATE_WINDOW_S = 3.0


class RawReader:
    """An SSE reader on a bare socket, which can leave without a word."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.status = 0
        self.head = b""

    @classmethod
    async def open(
        cls, base_url: str, path: str, key: str, *, method: str = "GET", body: bytes = b""
    ) -> RawReader:
        parts = urlsplit(base_url)
        assert parts.hostname is not None and parts.port is not None
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        raw = cls(reader, writer)
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        raw.head = await reader.readuntil(b"\r\n\r\n")
        raw.status = int(raw.head.split()[1])
        return raw

    def drop(self, *, reset: bool) -> None:
        """Leave: a reset (RST), or a plain close (FIN), as browsers and proxies do."""
        if reset:
            self.writer.transport.abort()
        else:
            self.writer.close()


class StatementCounter:
    """Counts the SQL statements the app sends to its database."""

    def __init__(self, app: Any) -> None:
        self.count = 0
        for engine in app_sync_engines(app):  # the requests' and the turns'
            event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *_: Any) -> None:
        self.count += 1

    async def rate(self, window_s: float = RATE_WINDOW_S) -> float:
        """Statements a second over the next ``window_s``."""
        before = self.count
        await asyncio.sleep(window_s)
        return (self.count - before) / window_s


async def post(http: aiohttp.ClientSession, key: str, message_id: str) -> str:
    async with http.post(
        "/v1/messages",
        json={"conversation_id": "c", "message_id": message_id, "text": "Hello there"},
        headers=auth(key),
    ) as response:
        assert response.status == 202, await response.text()
        return str((await response.json())["turn_id"])


async def test_readers_of_a_queued_turn_who_leave_stop_at_once_and_stop_polling(
    db_url: str, engine: Any, engine_settings: EngineSettings, chat_format: ChatFormat
) -> None:
    gated = GatedEngine(engine)
    settings = make_settings(db_url, engine_settings, server={"max_streams_per_key": 2 * READERS})
    app = await create_app(settings, engine=gated, chat_format=chat_format)
    statements = StatementCounter(app)
    key = await issue_key(db_url)
    ops = await admin_key(db_url)
    readers, followers = app[STREAM_READERS], app[TURN_FOLLOWERS]
    async with serving(app) as base, aiohttp.ClientSession(base) as http:
        first = await post(http, key, "m1")
        await wait_until(lambda: gated.waiting == 1, 30)  # the first turn runs, held
        queued = await post(http, key, "m2")  # ... and this one waits behind it
        idle = await statements.rate()

        slots = asyncio.Semaphore(OPENING_AT_ONCE)

        async def open_one() -> RawReader:
            async with slots:
                return await RawReader.open(base, f"/v1/turns/{queued}/events", key)

        opened = await asyncio.gather(*(open_one() for _ in range(READERS)))
        assert {raw.status for raw in opened} == {200}
        await wait_until(lambda: readers.count == READERS, 10)
        # On PostgreSQL the queued turn's readers are fed from its row: by one poller.
        assert followers.pollers == (0 if is_sqlite(db_url) else 1)
        busy = await statements.rate()

        for index, raw in enumerate(opened):
            raw.drop(reset=index % 2 == 0)
        gone_s = await wait_until(lambda: readers.count == 0, 2.0)
        assert followers.pollers == 0 and followers.readers == 0
        after = await statements.rate()
        async with http.get("/metrics", headers=auth(ops)) as response:
            exposed = samples(await response.text())
        assert value(exposed, "bot_event_streams_open") == 0
        assert value(exposed, "bot_followed_turn_pollers") == 0
        print(
            f"\n{READERS} readers: all gone {gone_s:.2f} s after the drop; statements/s "
            f"idle {idle:.1f}, {READERS} readers {busy:.1f}, after the drop {after:.1f}"
        )
        # One poller for all of them (4 reads a second), not one per reader (2,000).
        assert busy - idle < 10
        # A poller left behind would add 4 a second.
        assert after - idle < 2

        # Readers who stay still get the whole reply, then end; nothing is left running.
        staying = [
            asyncio.create_task(
                read_sse(await http.get(f"/v1/turns/{turn}/events", headers=auth(key)))
            )
            for turn in (first, queued, queued)
        ]
        await wait_until(lambda: readers.count == 3, 10)
        gated.gate.set()
        async with asyncio.timeout(60):
            finals = [await task for task in staying]
        assert [events[-1].kind for events in finals] == ["done", "done", "done"]
        assert finals[1] == finals[2]
        await wait_until(lambda: readers.count == 0 and followers.pollers == 0, 2.0)


async def test_a_stream_waiting_in_the_queue_gets_keepalive_comments(
    sqlite_url: str, engine: Any, engine_settings: EngineSettings, chat_format: ChatFormat
) -> None:
    gated = GatedEngine(engine)
    settings = make_settings(sqlite_url, engine_settings, server={"sse_keepalive_s": 0.2})
    app = await create_app(settings, engine=gated, chat_format=chat_format)
    key = await issue_key(sqlite_url)
    async with serving(app) as base, aiohttp.ClientSession(base) as http:
        await post(http, key, "m1")
        await wait_until(lambda: gated.waiting == 1, 30)
        queued = await post(http, key, "m2")
        raw = await RawReader.open(base, f"/v1/turns/{queued}/events", key)
        assert raw.status == 200
        seen: list[bytes] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.1):
                while True:
                    seen.append(await raw.reader.readline())
        # Chunked framing around each comment: keep only its own line.
        assert sum(line == b": keep-alive\r\n" or line == b": keep-alive\n" for line in seen) >= 3
        raw.drop(reset=False)
        gated.gate.set()


async def test_event_streams_per_key_are_capped(
    sqlite_url: str, engine: Any, engine_settings: EngineSettings, chat_format: ChatFormat
) -> None:
    gated = GatedEngine(engine)
    settings = make_settings(sqlite_url, engine_settings, server={"max_streams_per_key": 2})
    app = await create_app(settings, engine=gated, chat_format=chat_format)
    key = await issue_key(sqlite_url)
    other_key = await issue_key(sqlite_url, name="bob")
    readers = app[STREAM_READERS]
    async with serving(app) as base, aiohttp.ClientSession(base) as http:
        turn = await post(http, key, "m1")
        path = f"/v1/turns/{turn}/events"
        held = [await RawReader.open(base, path, key) for _ in range(2)]
        assert [raw.status for raw in held] == [200, 200]

        async with http.get(path, headers=auth(key)) as response:
            assert response.status == 429
            refusal = await response.json()
        assert refusal["error"] == "rate_limited"
        assert "limit is 2" in refusal["reason"]
        rows = await count_rows(sqlite_url)
        async with http.post(
            "/v1/messages",
            json={"conversation_id": "c", "message_id": "m2", "text": "and?"},
            headers={**auth(key), "Accept": "text/event-stream"},
        ) as response:
            assert response.status == 429
        assert await count_rows(sqlite_url) == rows  # refused: nothing stored

        # Another key has its own streams.
        bobs = await post(http, other_key, "b1")
        other = await RawReader.open(base, f"/v1/turns/{bobs}/events", other_key)
        assert other.status == 200
        # A reader that leaves gives its slot back.
        held[0].drop(reset=True)
        await wait_until(lambda: readers.count == 2, 2.0)
        async with http.get(path, headers=auth(key)) as response:
            assert response.status == 200
            gated.gate.set()
            events = await read_sse(response)
        assert events[-1].kind == "done"
        held[1].drop(reset=False)
        other.drop(reset=False)
