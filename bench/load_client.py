"""The two other processes of bench/load.py: the client that sends the arrivals, and the
platforms' side of the turns they create.

* ``client BASE_URL CHANNELS`` (the API key in ``BENCH_LOAD_KEY``): per plan line on stdin
  (``{"rate", "seconds", "conversations", "run"}``) it sends open-loop Poisson arrivals,
  each message leaving at its scheduled time whatever the earlier ones are doing (a client
  that waited for each ack would hide a slow ack behind its own pacing), in turn over
  the channels, and answers ``[[channel, ack ms, HTTP status], ...]``.
* ``fakes``: the strict Telegram and Slack fakes (``bot.testing``) the turns' replies go
  to, answering any line with their base URLs. The real platforms answer from
  elsewhere; served from the service's process they would share its event loop.
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
from harness import JsonLinesProcess, answer_json_lines
from platform_requests import (
    SLACK_BOT_USER,
    SLACK_TEAM,
    SLACK_TOKEN,
    SLACK_USER,
    TELEGRAM_BOT,
    TELEGRAM_TOKEN,
    TELEGRAM_USERNAME,
    slack_headers,
    slack_mention,
    telegram_headers,
    telegram_update,
)

from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram

KEY_ENV = "BENCH_LOAD_KEY"
Request = tuple[str, bytes, dict[str, str]]


class Senders:
    """One message as each platform sends it: (path, body, headers)."""

    def __init__(self, key: str) -> None:
        self._key = key
        # Telegram's update ids are its dedupe key: a run must not repeat an earlier run's.
        # Below 10**6 a run: Slack's ts keeps its six decimals.
        self._ids = itertools.count(random.randrange(1, 900_000))

    def request(self, channel: str, run: str, conversation: int, text: str) -> Request:
        number = next(self._ids)
        if channel == "telegram":
            body = telegram_update(800_000_000 + number, 500_000 + conversation, text)
            return f"/telegram/{TELEGRAM_BOT}", body, telegram_headers()
        if channel == "slack":
            ts, thread = f"{int(time.time())}.{number:06d}", f"1700000000.{conversation:06d}"
            raw = slack_mention(f"Ev{run}{number:08d}", ts, thread, text)
            return "/slack/events", raw, slack_headers(raw)
        payload = {"conversation_id": f"{run}-c{conversation}", "message_id": f"{run}-m{number}"}
        headers = {"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"}
        return "/v1/messages", json.dumps({**payload, "text": text}).encode(), headers


async def post_one(http: aiohttp.ClientSession, base: str, request: Request) -> tuple[float, int]:
    path, body, headers = request
    started = time.perf_counter()
    async with http.post(f"{base}{path}", data=body, headers=headers) as response:
        await response.read()
        return (time.perf_counter() - started) * 1000, response.status


async def arrivals(
    http: aiohttp.ClientSession, base: str, senders: Senders, channels: list[str], plan: Any
) -> list[tuple[str, float, int]]:
    """Message i goes to channel i % C and conversation i % K, at Poisson times."""
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
        request = senders.request(channel, plan["run"], index % plan["conversations"], text)
        tasks.append(asyncio.create_task(post_one(http, base, request)))
        sent.append(channel)
        at += rng.expovariate(plan["rate"])
    results = await asyncio.gather(*tasks)
    return [(channel, ms, status) for channel, (ms, status) in zip(sent, results, strict=True)]


def client_process(base: str, key: str, channels: list[str]) -> JsonLinesProcess:
    return JsonLinesProcess(__file__, ["client", base, ",".join(channels)], {KEY_ENV: key})


def fakes_process() -> JsonLinesProcess:
    return JsonLinesProcess(__file__, ["fakes"], {})


async def serve_client(base: str, channels: list[str]) -> None:
    senders = Senders(os.environ[KEY_ENV])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await answer_json_lines(lambda plan: arrivals(http, base, senders, channels, plan))


async def serve_fakes() -> None:
    """One bot, one workspace with one user, until stdin ends."""
    async with FakeTelegram() as telegram:
        telegram.add_bot(TELEGRAM_TOKEN, TELEGRAM_USERNAME)
        slack = FakeSlackApi()
        slack.add_workspace(SLACK_TOKEN, SLACK_TEAM, bot_user_id=SLACK_BOT_USER)
        slack.add_user(SLACK_TEAM, SLACK_USER, display_name="Alice")
        urls = {"telegram": telegram.base_url, "slack": await slack.start()}
        try:

            async def answer(_: object) -> dict[str, str]:
                return urls

            await answer_json_lines(answer)
        finally:
            await slack.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=["client", "fakes"])
    parser.add_argument("base", nargs="?", help="client: the service's base URL")
    parser.add_argument("channels", nargs="?", default="", help="client: api,telegram,slack")
    args = parser.parse_args()
    if args.role == "client":
        asyncio.run(serve_client(args.base, [c for c in args.channels.split(",") if c]))
    else:
        asyncio.run(serve_fakes())
