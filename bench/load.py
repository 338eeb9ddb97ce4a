"""Benchmark: how fast the service acknowledges messages while the engine is busy.

Open-loop (Poisson) arrivals at each given rate into POST /v1/messages, spread
over many conversations, while the turns they create generate on the real
engine (demo model). A client that waits for the ack before sending the next
message would hide a slow ack behind its own pacing: here a message leaves at
its scheduled time whatever the earlier ones are doing.

Prints, per rate: messages sent, ack p50/p99/max, lost (acknowledged but not
final once the engine has drained; must be 0) and refused (non-202), then the
first rate whose ack p99 passes 25 ms.

Run:  .venv/bin/python bench/load.py --rates 25,50,100 --seconds 4
      .venv/bin/python bench/load.py --database postgresql+asyncpg://127.0.0.1/test
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from sqlalchemy import func, select

from bot.apikeys import create_key
from bot.config import load_settings
from bot.demo_model import build_demo_model
from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.app import create_app
from bot.http.keys import TURNS
from bot.log import configure_logging
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.migrate import upgrade
from bot.storage.models import Turn, TurnStatus

ACK_P99_GOAL_MS = 25.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def post_one(
    http: aiohttp.ClientSession, base: str, key: str, payload: dict[str, Any]
) -> tuple[float, int]:
    started = time.perf_counter()
    async with http.post(
        f"{base}/v1/messages", json=payload, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        await response.read()
        return (time.perf_counter() - started) * 1000, response.status


async def arrivals(
    http: aiohttp.ClientSession,
    base: str,
    key: str,
    rate: float,
    seconds: float,
    conversations: int,
    run: str,
) -> list[tuple[float, int]]:
    """Send Poisson arrivals at ``rate``/s for ``seconds``; return (ack ms, status) each."""
    rng = random.Random(f"{run}-{rate}")
    tasks: list[asyncio.Task[tuple[float, int]]] = []
    start = time.perf_counter()
    at = 0.0
    index = 0
    while at < seconds:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        payload = {
            "conversation_id": f"{run}-c{index % conversations}",
            "message_id": f"{run}-m{index}",
            "text": f"Message {index}: tell me something about the number {index}.",
        }
        tasks.append(asyncio.create_task(post_one(http, base, key, payload)))
        index += 1
        at += rng.expovariate(rate)
    return list(await asyncio.gather(*tasks))


async def open_turns(db_url: str) -> tuple[int, int]:
    """(turns not final, turns in all)."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            pending = await session.scalar(
                select(func.count()).select_from(Turn).where(Turn.status.not_in(TurnStatus.FINAL))
            )
            total = await session.scalar(select(func.count()).select_from(Turn))
        return int(pending or 0), int(total or 0)
    finally:
        await engine.dispose()


async def main(args: argparse.Namespace) -> None:
    configure_logging(os.environ.get("BENCH_LOG_LEVEL", "WARNING"), "json")
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    model = build_demo_model(Path(args.model_dir))
    db_url = args.database or f"sqlite+aiosqlite:///{workdir / 'bench.db'}"
    await asyncio.to_thread(upgrade, db_url)
    settings = load_settings(
        None,
        database={"url": db_url},
        engine={"model": str(model), "dtype": "float32", "max_model_len": 4096, "block_size": 32},
        generation={"max_tokens": args.max_tokens, "temperature": 0.0, "top_p": 1.0},
        logging={"level": "WARNING"},
        limits={"messages_per_minute": 0, "tokens_per_day": 0},
    )
    engine = LocalVLLMEngine(settings.engine)
    await engine.start()
    app = await create_app(settings, engine=engine)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    db = create_engine(db_url)
    async with create_sessionmaker(db)() as session, session.begin():
        key = (await create_key(session, name=f"bench-{uuid.uuid4().hex[:6]}")).key
    await db.dispose()

    rates = [float(r) for r in args.rates.split(",")]
    run = uuid.uuid4().hex[:6]
    print(f"# ack latency of POST /v1/messages under open-loop load, {args.seconds:g} s a rate,")
    print(f"# {args.conversations} conversations, max_tokens={args.max_tokens}, demo model, CPU,")
    print(f"# database: {'SQLite' if db_url.startswith('sqlite') else 'PostgreSQL'}")
    print("rate/s  sent  ack_p50_ms  ack_p99_ms  ack_max_ms  refused  lost")
    first_over: float | None = None
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        for rate in rates:
            results = await arrivals(
                http, base, key, rate, args.seconds, args.conversations, f"{run}-{rate:g}"
            )
            acks = [ms for ms, status in results if status == 202]
            refused = sum(1 for _, status in results if status != 202)
            await app[TURNS].wait_idle(args.drain_s)
            pending, _ = await open_turns(db_url)
            p99 = percentile(acks, 99)
            print(
                f"{rate:>6g}  {len(results):>4}  {percentile(acks, 50):>10.1f}  {p99:>10.1f}"
                f"  {max(acks, default=float('nan')):>10.1f}  {refused:>7}  {pending:>4}"
            )
            if first_over is None and p99 > ACK_P99_GOAL_MS:
                first_over = rate
    if first_over is None:
        print(f"ack p99 stayed within {ACK_P99_GOAL_MS:g} ms at every rate tried")
    else:
        print(f"ack p99 first passed {ACK_P99_GOAL_MS:g} ms at {first_over:g} messages/s")
    await runner.cleanup()
    await engine.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="25,50,100", help="messages per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="arrivals per rate")
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--drain-s", type=float, default=300.0)
    parser.add_argument("--database", default=None, help="a database URL (default: new SQLite)")
    parser.add_argument("--model-dir", default="data/demo-model")
    asyncio.run(main(parser.parse_args()))
