"""Benchmark: what one generation request to a remote replica costs, next to plain aiohttp.

A turn on a remote engine (``engine.kind = "openai"``) sends one streaming
``POST /v1/completions`` before its first token. Here N of them, one after the
other, go to a replica on loopback that answers at once with a one-token reply
(the test suite's fake replica, ``tests/remote/misbehaving.py``, mode "ok"), so
what is timed is the client side alone:

- the engine: ``OpenAIRemoteEngine.generate``, read to its final chunk;
- plain aiohttp: the same POST and read through a bare ``ClientSession``;
- plain aiohttp with ``trust_env=True``: what the engine's sessions did before
  they resolved each replica's proxy once at start. aiohttp then reads
  HTTP(S)_PROXY / NO_PROXY and ~/.netrc in worker threads at every request.

Prints the median ms per request (of the last 80 %) for each, in turn, twice.

Run:  .venv/bin/python bench/remote_request.py [--n 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.engine.base import GenerationRequest
from bot.engine.openai_remote import OpenAIRemoteEngine
from bot.engine.settings import EngineSettings
from bot.log import configure_logging
from tests.remote.misbehaving import MisbehavingServer

BODY = {
    "model": "other-model",
    "prompt": [1, 2, 3],
    "max_tokens": 1,
    "stream": True,
    "stream_options": {"include_usage": True},
    "return_token_ids": True,
}


async def per_request_ms(n: int, send: Callable[[int], Awaitable[None]]) -> float:
    times = []
    for i in range(n):
        started = time.perf_counter()
        await send(i)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[n // 5 :])


async def main(n: int) -> None:
    configure_logging("WARNING", "json")
    replica = MisbehavingServer(mode="ok")
    await replica.start()
    url = f"{replica.base_url}/v1/completions"
    engine = OpenAIRemoteEngine(
        EngineSettings(
            kind="openai",
            base_urls=[replica.base_url],
            api_key=SecretStr("bench"),
            served_model_name="other-model",  # what the fake replica lists
            max_attempts=1,
        )
    )
    await engine.start()

    async def through_engine(i: int) -> None:
        request = GenerationRequest(f"r{i}", [1, 2, 3], 1, 0.0, 1.0, session_key=f"c{i % 10}")
        async for _ in engine.generate(request):
            pass

    def through(http: aiohttp.ClientSession) -> Callable[[int], Awaitable[None]]:
        async def send(i: int) -> None:
            async with http.post(url, json=BODY, headers={"Authorization": "Bearer bench"}) as r:
                await r.read()

        return send

    async with (
        aiohttp.ClientSession() as plain,
        aiohttp.ClientSession(trust_env=True) as trusting,
    ):
        ways = [
            ("the engine (OpenAIRemoteEngine.generate)", through_engine),
            ("plain aiohttp", through(plain)),
            ("plain aiohttp, trust_env=True", through(trusting)),
        ]
        print(f"# {n} one-token requests in a row to a loopback replica, median of the last 80 %")
        print(f"{'client':<45} {'ms per request':>15}")
        for _ in range(2):
            for name, send in ways:
                print(f"{name:<45} {await per_request_ms(n, send):>15.3f}")
    await engine.shutdown()
    await replica.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1500, help="requests per line")
    asyncio.run(main(parser.parse_args().n))
