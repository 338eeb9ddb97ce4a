"""The client side of bench/turns.py: N conversations x T turns over the HTTP API.

Each turn: ``POST /v1/messages``, then its event stream (``/v1/turns/{id}/events``) read
to the end, timed by the client: the ack, the TTFT (POST sent to the first delta) and
the end to end. With a pause each chat waits before its next message as a person would,
a random time (exponential, that mean; seeded per chat): the chats' turns then no
longer start, and end, in step.

bench/turns.py runs it as a process of its own (``python bench/turns_client.py
BASE_URL``, the API key in ``BENCH_TURNS_KEY``), so that parsing every event of every
stream does not share the service's loop. One ``{"conversations", "turns", "pause_s"}``
line on stdin, one ``{"conversations": [[turn, ...], ...], "wall_s"}`` line back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from typing import Any

import aiohttp
from harness import JsonLinesProcess, answer_json_lines

KEY_ENV = "BENCH_TURNS_KEY"
USER_LINES = [
    "Hello! How are you today?",
    "Tell me about the weather in Paris this week.",
    "And what about London and Berlin?",
    "Please answer briefly and politely.",
    "What can I do for you? Numbers: 1 2 3 100.",
    "Code: def main(): return print('hello world')",
    "Markdown: **bold**, _italic_, `code`.",
    "Questions and answers, greetings and farewells.",
]


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
            "text": USER_LINES[index % len(USER_LINES)],
        }
        sent_at = time.perf_counter()
        async with http.post(f"{base}/v1/messages", json=payload, headers=headers) as response:
            body = await response.json()
        ack_ms = (time.perf_counter() - sent_at) * 1000
        async with http.get(f"{base}{body['stream_url']}", headers=headers) as response:
            result = await read_stream(response, sent_at)
        results.append({"turn": index, "turn_id": body["turn_id"], "ack_ms": ack_ms, **result})
    return results


async def run_chats(base: str, key: str, plan: dict[str, Any]) -> dict[str, Any]:
    """The conversations, all at once."""
    async with aiohttp.ClientSession() as http:
        started = time.perf_counter()
        conversations = await asyncio.gather(
            *(chat(http, base, key, f"conv-{i}", plan) for i in range(plan["conversations"]))
        )
        return {"conversations": conversations, "wall_s": time.perf_counter() - started}


async def run_chats_in_subprocess(base: str, key: str, plan: dict[str, Any]) -> dict[str, Any]:
    """``run_chats`` from a process of its own: this file, run as a script."""
    async with JsonLinesProcess(__file__, [base], {KEY_ENV: key}) as client:
        result: dict[str, Any] = await client.ask(plan)
        return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", help="the service's base URL, e.g. http://127.0.0.1:8080")
    base, key = parser.parse_args().base, os.environ[KEY_ENV]
    asyncio.run(answer_json_lines(lambda plan: run_chats(base, key, plan)))
