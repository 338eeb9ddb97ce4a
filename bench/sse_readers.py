"""Benchmark: N SSE readers of a queued turn on PostgreSQL, then all dropped at once.

The turn waits behind one that "another worker" holds (a live lease), so this
worker only follows it through its row, where each reader could cost the
database a poll. The app is served the way ``botctl serve`` serves it
(``web.AppRunner`` defaults: handlers are not cancelled when clients leave);
readers are bare sockets that leave without a word.

Prints SQL statements a second sent by the app (counted in-process) with no reader,
with N readers, and after the drop (all three should be alike), plus the app's own tasks
left running.
Needs a PostgreSQL (``--admin-dsn``) and the demo model (built if missing).

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

from aiohttp import web
from harness import DEMO_MODEL_DIR, scratch_database
from sqlalchemy import event

from bot.apikeys import create_key
from bot.app import create_app
from bot.config import load_settings
from bot.http.keys import DB_ENGINES
from bot.models.demo_model import build_demo_model
from bot.storage.conversations import allocate_turn_seq, open_conversation
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Turn, TurnStatus
from bot.turns.chat_format import ChatFormat, load_tokenizer

WINDOW_S = 3.0


class IdleEngine:
    """Never asked to generate here: the only turn that could run is another worker's."""

    max_model_len = 1024

    async def start(self) -> None:
        return None

    async def generate(self, request: Any) -> Any:
        raise AssertionError("not expected")

    async def abort(self, request_id: str) -> None:
        return None

    async def check_health(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None


async def seed(url: str) -> tuple[str, str]:
    """A key, and a queued turn behind a turn another worker runs (lease far ahead)."""
    engine = create_engine(url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            key = (await create_key(session, name="bench", owner="bench")).key
            conversation = await open_conversation(
                session, owner="bench", channel="api", external_key="c"
            )
            for status in (TurnStatus.RUNNING, TurnStatus.QUEUED):
                turn = Turn(
                    conversation_id=conversation.id,
                    seq=await allocate_turn_seq(session, conversation.id),
                    channel="api",
                    user_text="hello",
                    status=status,
                )
                if status == TurnStatus.RUNNING:
                    turn.lease_owner = "another-worker"
                    turn.lease_expires_at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
                session.add(turn)
                await session.flush()
            return key, turn.id
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


async def run(args: argparse.Namespace) -> None:
    async with scratch_database(Path(tempfile.gettempdir()), args.admin_dsn) as url:
        await measure(args, url)


async def measure(args: argparse.Namespace, url: str) -> None:
    runner: web.AppRunner | None = None
    try:
        key, turn_id = await seed(url)
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

        async def rate() -> float:
            before = statements[0]
            await asyncio.sleep(WINDOW_S)
            return (statements[0] - before) / WINDOW_S

        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        await asyncio.sleep(1.0)
        idle_tasks = len(asyncio.all_tasks())
        idle = await rate()
        gate = asyncio.Semaphore(50)

        async def one() -> asyncio.StreamWriter:
            async with gate:
                return await open_reader(port, f"/v1/turns/{turn_id}/events", key)

        started = time.monotonic()
        writers = await asyncio.gather(*(one() for _ in range(args.readers)))
        opened_s = time.monotonic() - started
        await asyncio.sleep(1.0)
        busy_tasks = len(asyncio.all_tasks())
        busy = await rate()
        for writer in writers:
            writer.transport.abort()
        await asyncio.sleep(2.0)
        left_tasks = len(asyncio.all_tasks())
        after = await rate()
        print(
            f"{args.readers} readers of a queued turn (opened in {opened_s:.1f} s)\n"
            f"  SQL statements/s: idle {idle:.1f}, with readers {busy:.1f}, "
            f"2 s after the drop {after:.1f}\n"
            f"  asyncio tasks: idle {idle_tasks}, with readers {busy_tasks}, "
            f"2 s after the drop {left_tasks}"
        )
    finally:
        if runner is not None:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=500)
    parser.add_argument("--admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--model-dir", default=str(DEMO_MODEL_DIR))
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
