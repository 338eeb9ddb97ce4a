"""Many turns at once on one real vLLM server: none fails for waiting on a pooled connection.

Each streaming turn holds one connection to its replica for its whole reply.
With aiohttp's defaults (100 connections a pool, and the connect timeout
counting the wait for a free one) the 101st concurrent turn failed as
``timeout`` although the server was healthy, and ``/readyz``'s health check
queued behind the streams and turned 503.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from bot.app import create_app
from bot.config import EngineSettings
from bot.engine.openai_remote import OpenAIRemoteEngine
from bot.http.keys import TURNS
from bot.testing.vllm_servers import VLLMServer
from bot.turns.chat_format import ChatFormat
from tests.conftest import issue_key, make_settings
from tests.engines import GatedEngine
from tests.helpers import auth, load_turns, read_sse, wait_until
from tests.production_server import serving
from tests.remote.conftest import remote_settings

# Two vLLM servers start first (minutes on a busy 2-core machine), then 150 turns.
pytestmark = [pytest.mark.postgres, pytest.mark.timeout(900)]
CONCURRENT_TURNS = 150
READYZ_EVERY_S = 0.25
MAX_TOKENS = 160


async def test_150_concurrent_turns_on_one_replica_never_time_out_and_readyz_stays_200(
    pg_url: str,
    vllm_servers: list[VLLMServer],
    demo_model_dir: Path,
    engine_settings: EngineSettings,
    chat_format: ChatFormat,
) -> None:
    server = next(s for s in vllm_servers if not s.killed)
    remote = OpenAIRemoteEngine(remote_settings([server.base_url], model=str(demo_model_dir)))
    # Every turn waits at the gate until all are in: then they all stream at once.
    gated = GatedEngine(remote)
    settings = make_settings(
        pg_url,
        engine_settings,
        # Long enough that the first 100 streams outlast the old pool wait (3 tries x 2 s).
        generation={"max_tokens": MAX_TOKENS, "temperature": 0.0, "top_p": 1.0},
        server={"max_streams_per_key": 2 * CONCURRENT_TURNS},
        limits={"messages_per_minute": 0, "tokens_per_day": 0},
    )
    await remote.start()
    app = await create_app(settings, engine=gated, chat_format=chat_format)
    key = await issue_key(pg_url)
    readyz: Counter[int] = Counter()
    not_ready: list[str] = []
    peak_in_flight = 0
    checked_while_streaming = 0
    done = asyncio.Event()

    # The test's own client must not be the bottleneck: no cap on its connections.
    async with (
        serving(app) as base,
        aiohttp.ClientSession(base, connector=aiohttp.TCPConnector(limit=0)) as http,
    ):

        async def watch_readiness() -> None:
            nonlocal peak_in_flight, checked_while_streaming
            while not done.is_set():
                async with http.get("/readyz") as response:
                    readyz[response.status] += 1
                    checked_while_streaming += int(gated.gate.is_set() and not done.is_set())
                    if response.status != 200:
                        not_ready.append((await response.json()).get("reason", ""))
                peak_in_flight = max(peak_in_flight, app[TURNS].in_flight)
                await asyncio.sleep(READYZ_EVERY_S)

        async def one_turn(index: int) -> str:
            async with http.post(
                "/v1/messages",
                json={
                    "conversation_id": f"load-{index}",
                    "message_id": "m1",
                    "text": f"Tell me about the number {index}.",
                },
                headers={**auth(key), "Accept": "text/event-stream"},
            ) as response:
                events = await read_sse(response)
            return events[-1].kind

        watcher = asyncio.create_task(watch_readiness())
        try:
            with structlog.testing.capture_logs() as captured:
                turns = [asyncio.create_task(one_turn(i)) for i in range(CONCURRENT_TURNS)]
                async with asyncio.timeout(300):
                    await wait_until(lambda: gated.waiting == CONCURRENT_TURNS, 240)
                    started = asyncio.get_running_loop().time()
                    gated.gate.set()
                    finals = await asyncio.gather(*turns)
                took = asyncio.get_running_loop().time() - started
        finally:
            done.set()
            await watcher
            await remote.shutdown()

    stored = await load_turns(pg_url)
    failures: Counter[Any] = Counter(t.error_class for t in stored if t.status != "done")
    # A try that timed out waiting for a pooled connection and was retried is a failure too,
    # hidden only while the retries last.
    attempts: Counter[Any] = Counter(
        line.get("error_class") for line in captured if line["event"] == "engine_attempt_failed"
    )
    print(
        f"\n{CONCURRENT_TURNS} turns streamed in {took:.1f} s once released, "
        f"peak {peak_in_flight} generating at once; "
        f"final events {Counter(finals)}; failures {dict(failures)}; "
        f"failed tries {dict(attempts)}; /readyz {dict(readyz)} {not_ready}, "
        f"{checked_while_streaming} while streaming"
    )
    assert len(stored) == CONCURRENT_TURNS
    assert failures == Counter()
    assert attempts == Counter()
    assert Counter(finals) == Counter({"done": CONCURRENT_TURNS})
    assert peak_in_flight > 100  # the load did go beyond aiohttp's default pool of 100
    # Every check passes: a check's own round trip has taken over 3 s here (vLLM's threads
    # on both cores), but streams and statements that just completed count as answers
    # (bot.ops.recent_answer). How many checks fit depends on how long the turns take to
    # arrive and stream (9 in one run of 3.7 s streaming): some must have been answered
    # while all the turns streamed.
    assert readyz[200] >= 5 and readyz[503] == 0, (dict(readyz), not_ready)
    assert checked_while_streaming >= 1, dict(readyz)
