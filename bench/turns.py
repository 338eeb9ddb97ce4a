"""Benchmark: what the service adds to a chat, next to the same prompts sent straight to vLLM.

N conversations x T turns through the HTTP API (``POST /v1/messages``, then the turn's
event stream) from a client process of its own (bench/clients.py); then the exact prompt
ids the service built, rebuilt from the stored history, straight to the same engine at the
same concurrency, its prefix cache reset in between. Prints the share of cacheable prompt
tokens (the previous prompt + reply's full blocks) served from the prefix cache; the ack
and the client's TTFT by turn; the service's own time before the first token (the client's
TTFT minus all the time the first text spent in vLLM), split at the engine and by whether
the message came alone or within 10 ms after other chats' (replies that end in one engine
step send their next messages together, handled one after another on the loop); the
client's TTFT next to the engine's for the same prompts; the turns' layers (the ``turn``
log line's) p50; end to end through the service against the engine alone.

Run:  .venv/bin/python bench/turns.py --conversations 4 --turns 12 --model data/smollm2
      add --pause-ms 500 for a person's pause before each next message (chats out of step)
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import clients
import harness
from sqlalchemy import select

from bot.app import create_app
from bot.config import load_settings
from bot.engine.base import GenerationChunk, GenerationRequest
from bot.engine.vllm_local import LocalVLLMEngine
from bot.ops.log import configure_logging
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Message, Turn
from bot.storage.tokens import unpack_token_ids

BURST_S = 0.010
"""Another chat's POST sent this long before a message puts the message in a burst."""


class FirstTextClock(LocalVLLMEngine):
    """The in-process engine, noting per request when ``generate`` was called and when the
    chunk with its first text came out (a token that decodes to no text yet is not
    streamed: the client's first delta waits for it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked_at: dict[str, float] = {}
        self.first_text_at: dict[str, float] = {}

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.asked_at[request.request_id] = time.perf_counter()
        async for chunk in super().generate(request):
            if chunk.text and request.request_id not in self.first_text_at:
                self.first_text_at[request.request_id] = time.perf_counter()
            yield chunk

    def in_vllm_ms(self, request_id: str) -> float:
        """From ``generate`` called to its first text: all of it vLLM's."""
        return (self.first_text_at[request_id] - self.asked_at[request_id]) * 1000


async def stored_prompts(db_url: str) -> list[list[list[int]]]:
    """Per conversation, each turn's exact prompt ids, rebuilt from the stored history."""
    engine = create_engine(db_url)
    prompts: dict[str, list[list[int]]] = {}
    async with create_sessionmaker(engine)() as session:
        for turn in await session.scalars(select(Turn).order_by(Turn.conversation_id, Turn.seq)):
            rows = await session.execute(
                select(Message.role, Message.token_ids, Message.turn_id)
                .where(Message.conversation_id == turn.conversation_id)
                .order_by(Message.seq)
            )
            prompt: list[int] = []
            for role, packed, turn_id in rows:
                prompt.extend(unpack_token_ids(packed))
                if turn_id == turn.id and role == "user":
                    break
            prompts.setdefault(turn.conversation_id, []).append(prompt)
    await engine.dispose()
    return list(prompts.values())


async def direct(
    engine: FirstTextClock, prompts: list[list[int]], max_tokens: int
) -> list[tuple[float, float]]:
    """One chat's prompts in order, straight to the engine: (TTFT to the first text, end to
    end) ms each, as a client of the engine would see them."""
    times = []
    for prompt in prompts:
        request = harness.greedy(prompt, max_tokens)
        request_id = request.request_id
        async for _ in engine.generate(request):
            pass
        ended = time.perf_counter()
        first = engine.first_text_at.get(request_id, ended)
        started = engine.asked_at[request_id]
        times.append(((first - started) * 1000, (ended - started) * 1000))
    return times


def burst_places(results: list[dict[str, Any]]) -> dict[str, str]:
    """Per turn: sent alone, or within ``BURST_S`` after 1 or 2+ other chats' POSTs."""
    sent = sorted(r["sent_at"] for r in results)
    places = {}
    for r in results:
        at = r["sent_at"]
        earlier = bisect.bisect_left(sent, at) - bisect.bisect_left(sent, at - BURST_S)
        places[r["turn_id"]] = ("alone", "after 1 other", "after 2+ others")[min(2, earlier)]
    return places


def line(name: str, values: list[float]) -> None:
    p50, p99 = harness.percentile(values, 50), harness.percentile(values, 99)
    print(f"{name:<52} {p50:>7.1f}  {p99:>7.1f}")


async def main(args: argparse.Namespace) -> None:
    # Per-turn log lines to a terminal would cost the service time the engine does not pay.
    configure_logging(os.environ.get("BENCH_LOG_LEVEL", "WARNING"), "json")
    model, dtype = harness.served_model(args)
    workdir = Path(tempfile.mkdtemp(prefix="bench-turns-"))
    async with harness.scratch_database(workdir, None) as db_url:
        engine_section = harness.local_engine(model, dtype)
        settings = load_settings(
            None, **harness.service_sections(db_url, engine_section, args.max_tokens)
        )
        engine = FirstTextClock(settings.engine)
        await engine.start()
        try:
            await measure(args, engine, await create_app(settings, engine=engine), db_url)
        finally:
            await engine.shutdown()


async def measure(args: argparse.Namespace, engine: FirstTextClock, app: Any, db_url: str) -> None:
    runner, base = await harness.serve_on_loopback(app)
    key = await harness.bench_key(db_url, "bench")
    plan = {"conversations": args.conversations, "turns": args.turns}
    plan["pause_s"] = args.pause_ms / 1000
    async with clients.process("chats", base, key=key) as client:
        chats = await client.ask(plan)
    await runner.cleanup()
    conversations: list[list[dict[str, Any]]] = chats["conversations"]
    results = [r for conversation in conversations for r in conversation]
    done = [r for r in results if r.get("kind") == "done" and r["turn_id"] in engine.first_text_at]

    # The same prompts straight to the engine, same concurrency, from a cold prefix cache.
    prompts = await stored_prompts(db_url)
    await engine.llm.reset_prefix_cache()
    started = time.perf_counter()
    direct_times = await asyncio.gather(*(direct(engine, p, args.max_tokens) for p in prompts))
    direct_wall = time.perf_counter() - started

    def usage(r: dict[str, Any]) -> tuple[int, int, int]:
        u = r["usage"]
        return u["prompt_tokens"], u["completion_tokens"], u["cached_tokens"]

    ended = [[usage(r) for r in chat if r.get("kind") == "done"] for chat in conversations]
    cached, cacheable = harness.prefix_reuse(ended)
    own = {r["turn_id"]: r["ttft_ms"] - engine.in_vllm_ms(r["turn_id"]) for r in done}
    places = burst_places(results)

    print(f"# {args.conversations} conversations x {args.turns} turns, max_tokens=", end="")
    print(
        f"{args.max_tokens}, {harness.model_name(args)}, CPU; load average {harness.load_average()}"
    )
    if args.pause_ms:
        print(f"# a pause of {args.pause_ms:g} ms (mean) before each next message")
    print(f"turns: {len(results)} ({len(results) - len(done)} failed)")
    print(f"prefix cache: {cached}/{cacheable} cacheable prompt tokens served from cache", end="")
    print(f" = {100 * cached / max(1, cacheable):.1f} % (turns 2..{args.turns})")
    line("ack of POST /v1/messages, ms p50 / p99", [r["ack_ms"] for r in results])
    print("turn  recomputed(mean)  ttft_p50_ms  ttft_p99_ms")
    for turn in range(args.turns):
        of_turn = [r for r in done if r["turn"] == turn]
        recomputed = statistics.mean(p - c for p, _, c in map(usage, of_turn)) if of_turn else 0
        ttft = [r["ttft_ms"] for r in of_turn]
        print(f"{turn + 1:>4}  {recomputed:>16.1f}  {harness.percentile(ttft, 50):>11.1f}", end="")
        print(f"  {harness.percentile(ttft, 99):>11.1f}")
    print(f"{'before the first token (ms)':<52} {'p50':>7}  {'p99':>7}")
    line("service's own: client TTFT - time in vLLM to it", list(own.values()))
    for place in ("alone", "after 1 other", "after 2+ others"):
        mine = [ms for turn_id, ms in own.items() if places[turn_id] == place]
        if mine:
            line(f"  sent {place} ({len(mine)})", mine)
    line(
        "  POST sent -> generate called",
        [(engine.asked_at[r["turn_id"]] - r["sent_at"]) * 1000 for r in done],
    )
    line(
        "  first text out of vLLM -> client's first delta",
        [(r["first_delta_at"] - engine.first_text_at[r["turn_id"]]) * 1000 for r in done],
    )
    line("client TTFT through the service", [r["ttft_ms"] for r in done])
    line("engine TTFT, same prompts sent directly", [t for chat in direct_times for t, _ in chat])
    layers: dict[str, list[float]] = {}
    for r in done:
        for name, value in r["timings_ms"].items():
            if isinstance(value, int | float):
                layers.setdefault(name, []).append(float(value))
    p50s = (f"{name} {harness.percentile(values, 50):.1f}" for name, values in layers.items())
    print("layers (turn log line), p50 ms: " + ", ".join(p50s))
    service_e2e = sum(r["e2e_ms"] for r in done)
    direct_e2e = sum(e2e for chat in direct_times for _, e2e in chat)
    print(f"end to end summed over turns: service {service_e2e:.0f} ms, engine direct", end="")
    print(f" {direct_e2e:.0f} ms, ratio {service_e2e / direct_e2e:.2f}")
    print(f"wall clock: service {chats['wall_s']:.2f} s, engine direct {direct_wall:.2f} s", end="")
    print(f", ratio {chats['wall_s'] / direct_wall:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--pause-ms", type=float, default=0.0, help="mean pause before a message")
    harness.add_model_arguments(parser)
    asyncio.run(main(parser.parse_args()))
