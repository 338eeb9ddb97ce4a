"""The client side of bench/load.py: builds each platform's requests and sends the arrivals.

By default bench/load.py runs it as a separate process (``python bench/load.py``
starts ``python bench/load_client.py BASE_URL CHANNELS``, the API key in
``BENCH_LOAD_KEY``), with its own event loop, so that building, signing and
timing the requests does not share the service's loop. Protocol, one JSON line
each way per batch of arrivals: a ``Plan`` on stdin, the list of
``[channel, ack ms, status]`` on stdout; end of stdin ends the process.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, Self

import aiohttp
from harness import LOOPS, JsonLinesProcess, answer_json_lines, run_on
from slack_sdk.signature import SignatureVerifier

TESTS = Path(__file__).resolve().parents[1] / "tests"
"""The real payload fixtures live in each channel's test folder."""
KEY_ENV = "BENCH_LOAD_KEY"
"""The API key reaches the client process in the environment, not on its command line."""
TELEGRAM_BOT = "loadbot"
TELEGRAM_SECRET = "load-Secret_header"
SLACK_BOT_USER = "UBOT0001"
SLACK_USER = "U0001ALICE"
SLACK_CHANNEL = "C0001LOAD"
SLACK_SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"

Ack = tuple[str, float, int]
"""One arrival: its channel, its ack latency (ms) and the HTTP status."""


@dataclass(frozen=True)
class Plan:
    """One batch of Poisson arrivals: ``rate``/s for ``seconds``, over ``conversations``."""

    rate: float
    seconds: float
    conversations: int
    run: str


class Senders:
    """One message as each platform sends it: (path, body, headers) for a conversation."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._telegram = json.loads(
            (TESTS / "telegram" / "fixtures" / "private_text.json").read_text()
        )
        self._slack = json.loads((TESTS / "slack" / "fixtures" / "app_mention.json").read_text())
        self._verifier = SignatureVerifier(SLACK_SIGNING_SECRET)
        # Telegram's update ids are the dedupe key: a run on a database that keeps earlier
        # runs' events (PostgreSQL) must not repeat them, or its messages are duplicates.
        # Below 10**6 with a run's messages: Slack's ts keeps its six decimals.
        self._ids = itertools.count(random.randrange(1, 900_000))

    def request(
        self, channel: str, run: str, conversation: int, text: str
    ) -> tuple[str, bytes, dict[str, str]]:
        number = next(self._ids)
        if channel == "telegram":
            update = copy.deepcopy(self._telegram)
            update["update_id"] = 800_000_000 + number
            message = update["message"]
            message["message_id"] = number
            message["chat"]["id"] = message["from"]["id"] = 500_000 + conversation
            message.update(text=text, date=int(time.time()))
            headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
            return f"/telegram/{TELEGRAM_BOT}", json.dumps(update).encode(), headers
        if channel == "slack":
            body = copy.deepcopy(self._slack)
            body["event_id"] = f"Ev{run}{number:08d}"
            body["event_time"] = int(time.time())
            ts = f"{int(time.time())}.{number:06d}"
            body["event"].update(
                ts=ts,
                event_ts=ts,
                thread_ts=f"1700000000.{conversation:06d}",
                channel=SLACK_CHANNEL,
                user=SLACK_USER,
                text=f"<@{SLACK_BOT_USER}> {text}",
            )
            body["event"].pop("blocks", None)
            raw = json.dumps(body)
            now = str(int(time.time()))
            signature = self._verifier.generate_signature(timestamp=now, body=raw) or ""
            headers = {
                "Content-Type": "application/json",
                "X-Slack-Request-Timestamp": now,
                "X-Slack-Signature": signature,
            }
            return "/slack/events", raw.encode(), headers
        payload = {"conversation_id": f"{run}-c{conversation}", "message_id": f"{run}-m{number}"}
        headers = {"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"}
        return "/v1/messages", json.dumps({**payload, "text": text}).encode(), headers


async def post_one(
    http: aiohttp.ClientSession, base: str, request: tuple[str, bytes, dict[str, str]]
) -> tuple[float, int]:
    path, body, headers = request
    started = time.perf_counter()
    async with http.post(f"{base}{path}", data=body, headers=headers) as response:
        await response.read()
        return (time.perf_counter() - started) * 1000, response.status


async def arrivals(
    http: aiohttp.ClientSession,
    base: str,
    senders: Senders,
    channels: list[str],
    rate: float,
    seconds: float,
    conversations: int,
    run: str,
) -> list[Ack]:
    """Send Poisson arrivals at ``rate``/s for ``seconds``; (channel, ack ms, status) each."""
    rng = random.Random(f"{run}-{rate}")
    tasks: list[asyncio.Task[tuple[float, int]]] = []
    sent: list[str] = []
    start = time.perf_counter()
    at = 0.0
    index = 0
    while at < seconds:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        channel = channels[index % len(channels)]
        text = f"Message {index}: tell me something about the number {index}."
        request = senders.request(channel, run, index % conversations, text)
        tasks.append(asyncio.create_task(post_one(http, base, request)))
        sent.append(channel)
        index += 1
        at += rng.expovariate(rate)
    results = await asyncio.gather(*tasks)
    return [(channel, ms, status) for channel, (ms, status) in zip(sent, results, strict=True)]


class LoadClient(Protocol):
    """Sends one batch of arrivals at a time, until the ``async with`` block ends."""

    async def send(self, plan: Plan) -> list[Ack]: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


class InProcessClient:
    """Sends the arrivals from the calling event loop (one HTTP session for every batch)."""

    def __init__(self, base: str, key: str, channels: list[str]) -> None:
        self._base = base
        self._channels = channels
        self._senders = Senders(key)
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def send(self, plan: Plan) -> list[Ack]:
        return await arrivals(
            self._http,
            self._base,
            self._senders,
            self._channels,
            plan.rate,
            plan.seconds,
            plan.conversations,
            plan.run,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.close()


class SubprocessClient:
    """Sends the arrivals from a process of its own: this file, run as a script."""

    def __init__(self, base: str, key: str, channels: list[str], loop: str) -> None:
        args = [base, ",".join(channels), "--loop", loop]
        self._process = JsonLinesProcess(__file__, args, {KEY_ENV: key})

    @property
    def pid(self) -> int | None:
        return self._process.pid

    async def send(self, plan: Plan) -> list[Ack]:
        results = await self._process.ask(asdict(plan))
        return [(channel, ms, status) for channel, ms, status in results]

    async def __aenter__(self) -> Self:
        await self._process.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._process.__aexit__(*exc_info)


async def serve_plans(base: str, key: str, channels: list[str]) -> None:
    """The client process: one line of results on stdout for each plan read from stdin."""
    async with InProcessClient(base, key, channels) as client:
        await answer_json_lines(lambda plan: client.send(Plan(**plan)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", help="the service's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("channels", help="ways in, in turn: api,telegram,slack")
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    arguments = parser.parse_args()
    channels = [c for c in arguments.channels.split(",") if c]
    run_on(arguments.loop, serve_plans(arguments.base, os.environ[KEY_ENV], channels))
