"""Benchmark: what many SSE readers of one turn cost the database, and what they leave behind.

N readers follow a queued turn on PostgreSQL, then all leave at once. The turn waits behind
one that "another worker" holds (a live lease), so this worker follows it through its row,
where each reader could cost the database a poll. The app is served as ``botctl serve``
serves it (``web.AppRunner``'s defaults: handlers are not cancelled when clients leave);
readers are bare sockets that leave without a word. Prints the SQL statements a second the
app sent with no reader, with N readers and after the drop (all three should be alike), and
the app's asyncio tasks at each point.

Run:  .venv/bin/python bench/sse_readers.py --readers 500
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import DEMO_MODEL_DIR, POSTGRES, bench_key, scratch_database, serve_on_loopback
from sqlalchemy import event

from bot.app import create_app
from bot.config import load_settings
from bot.http.keys import DB_ENGINES
from bot.models.demo_model import build_demo_model
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation, Turn, TurnStatus
from bot.turns.chat_format import ChatFormat, load_tokenizer
from bot.turns.owners import key_tenant

WINDOW_S = 3.0


class IdleEngine:
    """Never asked to generate here: the only turn that could run is another worker's."""

    max_model_len = 1024

    async def generate(self, request: Any) -> Any:
        raise AssertionError("not expected")

    async def start(self) -> None: ...
    async def abort(self, request_id: str) -> None: ...
    async def check_health(self) -> None: ...
    async def shutdown(self) -> None: ...


async def queued_turn(url: str) -> str:
    """A queued turn behind a running one another worker holds (its lease an hour ahead)."""
    engine = create_engine(url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            owner = key_tenant("bench")  # the key's tenant: its conversations' owner
            conversation = Conversation(
                owner=owner, channel="api", external_key="c", next_turn_seq=2
            )
            session.add(conversation)
            await session.flush()
            lease = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
            running = Turn(conversation_id=conversation.id, seq=0, status=TurnStatus.RUNNING)
            running.lease_owner, running.lease_expires_at = "another-worker", lease
            queued = Turn(conversation_id=conversation.id, seq=1, status=TurnStatus.QUEUED)
            for turn in (running, queued):
                turn.channel, turn.user_text = "api", "hello"
                session.add(turn)
            await session.flush()
            return queued.id
    finally:
        await engine.dispose()


async def open_reader(port: int, path: str, key: str) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], head
    return writer


async def measure(args: argparse.Namespace, url: str) -> None:
    turn_id, key = await queued_turn(url), await bench_key(url, "bench", owner="bench")
    model = build_demo_model(Path(args.model_dir))
    server = {"max_streams_per_key": args.readers * 2}
    settings = load_settings(
        None, database={"url": url}, engine={"model": str(model)}, server=server
    )
    app = await create_app(
        settings,
        engine=IdleEngine(),  # type: ignore[arg-type]
        chat_format=ChatFormat(load_tokenizer(str(model)), "bench"),
    )
    statements = [0]
    for db_engine in app[DB_ENGINES].distinct:  # the requests' and the turns'
        event.listen(
            db_engine.sync_engine,
            "before_cursor_execute",
            lambda *_: statements.__setitem__(0, statements[0] + 1),
        )

    async def rate_and_tasks(wait_s: float) -> str:
        await asyncio.sleep(wait_s)
        before = statements[0]
        await asyncio.sleep(WINDOW_S)
        return f"{(statements[0] - before) / WINDOW_S:.1f}/s, {len(asyncio.all_tasks())} tasks"

    runner, base = await serve_on_loopback(app)
    try:
        idle = await rate_and_tasks(1.0)
        gate = asyncio.Semaphore(50)

        async def one() -> asyncio.StreamWriter:
            async with gate:
                return await open_reader(
                    int(base.rsplit(":", 1)[1]), f"/v1/turns/{turn_id}/events", key
                )

        started = time.monotonic()
        writers = await asyncio.gather(*(one() for _ in range(args.readers)))
        opened_s = time.monotonic() - started
        busy = await rate_and_tasks(1.0)
        for writer in writers:
            writer.transport.abort()
        after = await rate_and_tasks(2.0)
        print(f"{args.readers} readers of a queued turn (opened in {opened_s:.1f} s)")
        print(f"  SQL statements, asyncio tasks: no reader {idle}; with the readers {busy};")
        print(f"  2 s after they left {after}")
    finally:
        await runner.cleanup()


async def main(args: argparse.Namespace) -> None:
    async with scratch_database(Path(tempfile.gettempdir()), args.admin_dsn) as url:
        await measure(args, url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=500)
    parser.add_argument("--admin-dsn", default=POSTGRES, help="a PostgreSQL server")
    parser.add_argument("--model-dir", default=str(DEMO_MODEL_DIR))
    asyncio.run(main(parser.parse_args()))
