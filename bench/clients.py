"""The processes a benchmark runs beside the service, so that building, parsing and timing
requests does not share the service's event loop (``harness.JsonLinesProcess``); the API
key comes in ``BENCH_KEY``, never on the command line:

* ``chats BASE_URL`` (bench/turns.py): per ``{"conversations", "turns", "pause_s"}`` line,
  the conversations over the API, each turn ``POST /v1/messages`` then its event stream
  read to the end, each chat pausing before its next message as a person would (``pause_s``
  mean, exponential); answers ``{"conversations": [[turn, ...], ...], "wall_s"}``.
* ``arrivals BASE_URL CHANNELS`` (bench/load.py): per ``{"rate", "seconds",
  "conversations", "run"}`` line, open-loop Poisson arrivals, each message leaving at its
  time whatever the earlier ones are doing (waiting for each ack would hide a slow ack
  behind the client's own pacing); answers ``[[channel, ack ms, HTTP status], ...]``.
* ``fakes`` (bench/load.py): the strict Telegram and Slack fakes the replies go to,
  answering any line with their base URLs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import time
from typing import Any

import aiohttp
import harness

from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram

KEY_ENV = "BENCH_KEY"
NUMBERS = itertools.count(1)
"""Each message's number: unique in a run (the platforms' dedupe keys are made of it)."""


def process(role: str, *args: str, key: str = "") -> harness.JsonLinesProcess:
    """This file run as ``role``, a process of its own."""
    return harness.JsonLinesProcess(__file__, [role, *args], {KEY_ENV: key})


# -- chats ---------------------------------------------------------------------------------


async def read_stream(response: aiohttp.ClientResponse, sent_at: float) -> dict[str, Any]:
    """The client's TTFT and end to end, and the final event's payload (``kind``: done or
    error; ``usage``; ``timings_ms``, the turn's stored layers). ``sent_at`` and
    ``first_delta_at`` are ``perf_counter``, the host's clock: the service marks against it."""
    first_delta: float | None = None
    final: dict[str, Any] = {}
    kind = ""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            if kind == "delta" and first_delta is None:
                first_delta = time.perf_counter()
            if kind in ("done", "error"):
                final = {"kind": kind, **json.loads(line[6:])}
    ended = time.perf_counter()
    first = first_delta or ended
    return {
        "sent_at": sent_at,
        "first_delta_at": first,
        "ttft_ms": (first - sent_at) * 1000,
        "e2e_ms": (ended - sent_at) * 1000,
        **final,
    }


async def chat(
    http: aiohttp.ClientSession, base: str, key: str, conversation: str, plan: dict[str, Any]
) -> list[dict[str, Any]]:
    results = []
    pauses = random.Random(conversation)
    headers = {"Authorization": f"Bearer {key}"}
    for index in range(plan["turns"]):
        if index and plan["pause_s"]:
            await asyncio.sleep(pauses.expovariate(1 / plan["pause_s"]))
        payload = {
            "conversation_id": conversation,
            "message_id": f"m{index}",
            "text": harness.USER_LINES[index % len(harness.USER_LINES)],
        }
        sent_at = time.perf_counter()
        async with http.post(f"{base}/v1/messages", json=payload, headers=headers) as response:
            body = await response.json()
        ack_ms = (time.perf_counter() - sent_at) * 1000
        async with http.get(f"{base}{body['stream_url']}", headers=headers) as response:
            result = await read_stream(response, sent_at)
        results.append({"turn": index, "turn_id": body["turn_id"], "ack_ms": ack_ms, **result})
    return results


async def serve_chats(base: str, key: str) -> None:
    async def run(plan: dict[str, Any]) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http:
            started = time.perf_counter()
            conversations = await asyncio.gather(
                *(chat(http, base, key, f"conv-{i}", plan) for i in range(plan["conversations"]))
            )
            return {"conversations": conversations, "wall_s": time.perf_counter() - started}

    await harness.answer_json_lines(run)


# -- arrivals ------------------------------------------------------------------------------


async def post_one(
    http: aiohttp.ClientSession, base: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[float, int]:
    started = time.perf_counter()
    async with http.post(f"{base}{path}", data=body, headers=headers) as response:
        await response.read()
        return (time.perf_counter() - started) * 1000, response.status


async def arrivals(
    http: aiohttp.ClientSession, base: str, key: str, channels: list[str], plan: Any
) -> list[tuple[str, float, int]]:
    """Message i goes to channel i % C and conversation i % K, at Poisson times; a Slack
    conversation is a thread whose root is not sent, as if posted before the run."""
    rng = random.Random(f"{plan['run']}-{plan['rate']}")
    tasks: list[asyncio.Task[tuple[float, int]]] = []
    sent: list[str] = []
    start = time.perf_counter()
    at = 0.0
    while at < plan["seconds"]:
        if (delay := start + at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        index = len(sent)
        channel = channels[index % len(channels)]
        text = f"Message {index}: tell me something about the number {index}."
        conversation = index % plan["conversations"]
        chat = {
            "telegram": str(500_000 + conversation),
            "slack": f"1700000000.{conversation:06d}",
        }.get(channel, f"{plan['run']}-c{conversation}")
        request = harness.platform_request(channel, next(NUMBERS), chat, text, key)
        tasks.append(asyncio.create_task(post_one(http, base, *request[:3])))
        sent.append(channel)
        at += rng.expovariate(plan["rate"])
    results = await asyncio.gather(*tasks)
    return [(channel, ms, status) for channel, (ms, status) in zip(sent, results, strict=True)]


async def serve_arrivals(base: str, key: str, channels: list[str]) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await harness.answer_json_lines(lambda plan: arrivals(http, base, key, channels, plan))


async def serve_fakes() -> None:
    telegram, slack = FakeTelegram(), FakeSlackApi()
    urls = await harness.open_platforms(telegram, slack)
    try:

        async def answer(_: object) -> dict[str, str]:
            return urls

        await harness.answer_json_lines(answer)
    finally:
        await harness.close_platforms(telegram, slack)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=["chats", "arrivals", "fakes"])
    parser.add_argument("base", nargs="?", help="the service's base URL")
    parser.add_argument("channels", nargs="?", default="", help="arrivals: api,telegram,slack")
    args = parser.parse_args()
    key = os.environ.get(KEY_ENV, "")
    if args.role == "chats":
        asyncio.run(serve_chats(args.base, key))
    elif args.role == "arrivals":
        asyncio.run(serve_arrivals(args.base, key, [c for c in args.channels.split(",") if c]))
    else:
        asyncio.run(serve_fakes())
