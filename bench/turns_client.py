"""The client side of bench/turns.py: N conversations x T turns over the HTTP API.

Each turn: POST /v1/messages, then its SSE stream (``/v1/turns/{id}/events``)
read to the end, timed by the client (TTFT from the POST to the first delta,
end-to-end to the end of the stream, the POST's ack). With ``one_request`` the
POST asks for ``text/event-stream`` and the reply streams in its own response
(the ack is then the time to its headers, sent once the message is stored).
With ``pause_s`` each chat waits before its next message as a person would, a
random time (exponential, that mean; seeded per chat): the chats' turns then no
longer start, and end, in step.

By default bench/turns.py runs it as a separate process (``python
bench/turns_client.py BASE_URL``, the API key in ``BENCH_TURNS_KEY``), with its
own event loop, so that parsing every event of every stream does not share the
service's loop and count as the service's time. Protocol (harness.JsonLinesProcess):
one ``Plan`` line on stdin (``{"conversations": N, "turns": T, ...}``), one
``Chats`` line back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
from harness import LOOPS, JsonLinesProcess, answer_json_lines, run_on

KEY_ENV = "BENCH_TURNS_KEY"
"""The API key reaches the client process in the environment, not on its command line."""
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


@dataclass(frozen=True)
class Chats:
    """What the client measured: per conversation, per turn, and the wall clock of them all.

    A turn: ``turn`` (its index), ``turn_id``, ``ack_ms``, ``ttft_ms``, ``e2e_ms``, then
    the final event's ``kind`` (done or error) and payload (``usage``, ``timings_ms``:
    the turn's stored ``layer_ms``), and ``sent_at`` (the POST asked for), ``on_wire_at``
    (its last byte handed to the kernel), ``first_delta_at`` (``perf_counter``).
    """

    conversations: list[list[dict[str, Any]]]
    wall_s: float


async def read_stream(response: aiohttp.ClientResponse, started: float) -> dict[str, Any]:
    """Client-side TTFT and e2e, plus the done event's payload."""
    first_delta: float | None = None
    done: dict[str, Any] = {}
    kind = ""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            if kind == "delta" and first_delta is None:
                first_delta = time.perf_counter()
            if kind in ("done", "error"):
                done = {"kind": kind, **json.loads(line[6:])}
    ended = time.perf_counter()
    return {
        # perf_counter is the host's monotonic clock: the service's process can set its own
        # marks against these two.
        "sent_at": started,
        "first_delta_at": first_delta or ended,
        "ttft_ms": ((first_delta or ended) - started) * 1000,
        "e2e_ms": (ended - started) * 1000,
        **done,
    }


async def chat(
    http: aiohttp.ClientSession,
    base: str,
    key: str,
    conversation: str,
    turns: int,
    one_request: bool,
    pause_s: float = 0.0,
) -> list[dict[str, Any]]:
    results = []
    pauses = random.Random(conversation)
    headers = {"Authorization": f"Bearer {key}"}
    streamed = {**headers, "Accept": "text/event-stream"}
    for index in range(turns):
        if index and pause_s:
            await asyncio.sleep(pauses.expovariate(1 / pause_s))
        payload = {
            "conversation_id": conversation,
            "message_id": f"m{index}",
            "text": USER_LINES[index % len(USER_LINES)],
        }
        started = time.perf_counter()
        on_wire: dict[str, float] = {}
        if one_request:
            async with http.post(
                f"{base}/v1/messages", json=payload, headers=streamed, trace_request_ctx=on_wire
            ) as response:
                ack_ms = (time.perf_counter() - started) * 1000
                result = await read_stream(response, started)
            results.append({"turn": index, "ack_ms": ack_ms, **result, **on_wire})
            continue
        async with http.post(
            f"{base}/v1/messages", json=payload, headers=headers, trace_request_ctx=on_wire
        ) as response:
            body = await response.json()
        ack_ms = (time.perf_counter() - started) * 1000
        async with http.get(f"{base}{body['stream_url']}", headers=headers) as response:
            result = await read_stream(response, started)
        results.append({"turn": index, "ack_ms": ack_ms, **result, **on_wire})
    return results


def on_wire_marks() -> aiohttp.TraceConfig:
    """Marks ``on_wire_at`` in a request's ``trace_request_ctx`` (a dict) each time a part of
    it is written: at the end, when its last byte went to the kernel. From there on the
    time is the service's (and the host's), not the client library's building of it."""

    async def written(_session: Any, context: Any, _params: Any) -> None:
        if isinstance(context.trace_request_ctx, dict):
            context.trace_request_ctx["on_wire_at"] = time.perf_counter()

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(written)
    trace.on_request_chunk_sent.append(written)
    return trace


@dataclass(frozen=True)
class Plan:
    """What the client is asked to do: ``conversations`` chats of ``turns`` turns each."""

    conversations: int
    turns: int
    one_request: bool = False
    pause_s: float = 0.0


async def run_chats(base: str, key: str, plan: Plan) -> Chats:
    """The conversations, all at once, from the calling event loop."""
    async with aiohttp.ClientSession(trace_configs=[on_wire_marks()]) as http:
        started = time.perf_counter()
        per_conversation = await asyncio.gather(
            *(
                chat(http, base, key, f"conv-{i}", plan.turns, plan.one_request, plan.pause_s)
                for i in range(plan.conversations)
            )
        )
        return Chats(per_conversation, time.perf_counter() - started)


async def run_chats_in_subprocess(base: str, key: str, loop: str, plan: Plan) -> Chats:
    """The same, from a process of its own: this file, run as a script on ``loop``."""
    async with JsonLinesProcess(__file__, [base, "--loop", loop], {KEY_ENV: key}) as client:
        answer = await client.ask(asdict(plan))
    return Chats(answer["conversations"], answer["wall_s"])


async def answer_requests(base: str, key: str) -> None:
    """The client process: one ``Chats`` line on stdout for each request read from stdin."""

    async def answer(request: dict[str, Any]) -> dict[str, Any]:
        return asdict(await run_chats(base, key, Plan(**request)))

    await answer_json_lines(answer)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", help="the service's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    arguments = parser.parse_args()
    run_on(arguments.loop, answer_requests(arguments.base, os.environ[KEY_ENV]))
