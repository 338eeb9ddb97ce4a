"""Benchmark: N conversations x T turns through the HTTP API vs the same prompts to the engine.

Prints
  * the share of cacheable prompt tokens served from vLLM's prefix cache (turns 2..T),
  * prompt tokens recomputed per turn (prompt - cached), by turn index,
  * TTFT by turn index (p50/p99), measured by the HTTP client,
  * the service's time before the first token (the client's TTFT minus the
    engine's own queue + prefill of that turn) next to the engine's part, and
    the TTFT of the same prompts sent straight to the engine; then the same to
    the first visible text: a client's first delta carries the first token that
    decodes to text, and the engine steps before it (a token that decodes to
    nothing, such as the demo model's ids past its tokenizer's 646 tokens, or
    part of a character) are the engine's time, not the service's; and the
    service's own time: the client's TTFT minus all the time its first text spent
    in vLLM, from the request to the engine client's chunk (vLLM's hops in this
    process included, which the requests sent directly have too), split at the
    engine (before ``generate`` is called, after its first text), with the client
    library's own part (``post()`` called to the request's last byte written) and the
    turns after each conversation's first (its first turn is the run's coldest),
    and by whether the message came alone or in a burst, behind other chats' POSTs
    sent in the 10 ms before it (replies that end in the same engine step),
  * the ack latency of POST /v1/messages (p50/p99),
  * the ratio of end-to-end time through the service to the same prompts sent
    straight to the engine (prefix cache reset in between, same concurrency),
  * the engine steps each run took (vLLM's own count), with tokens and wall
    clock a step: sent directly, the chats' turns start together and share
    steps; through the service each starts when its message has been handled,
    so the same tokens take more, emptier steps.
  * how long the service's loop thread and vLLM's processes ran and how long
    they were runnable but waited for a CPU while the chats ran (Linux's
    schedstat): on 2 cores the loop shares one with the client's process while
    vLLM's worker takes the other, and a message read while the loop waits is
    late by that much.

The HTTP client runs in a separate process with its own event loop
(bench/turns_client.py); this process only serves (and, after, sends the same
prompts straight to the engine). Run in the service's own loop, the client's
reading and parsing of every stream event would count as the service's time.
``--client-in-process`` runs it in the service's loop as before, to compare.

Run:  .venv/bin/python bench/turns.py --conversations 4 --turns 12
      .venv/bin/python bench/turns.py --conversations 16 --turns 6   (16 concurrent chats)
      .venv/bin/python bench/turns.py --model data/smollm2   (the model ``make run`` serves)
      add --loop uvloop to run the service (and the client) on uvloop's event loop
      add --one-request to stream each reply in its POST's response (no second request)
      add --pause-ms 500 for a person's pause before each next message (chats out of step)
      add --warm-process to serve another key's one-turn chat first (not counted)
      add --engine-server for the engine in a vLLM server of its own, pinned to the CPU the
          in-process engine's worker takes (``engine.kind = "openai"``, as a deployment with
          its engine on other machines has it): vLLM's own per-request and per-token Python
          then runs in that server, not on the service's event loop
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
from harness import (
    LOOPS,
    CpuWaits,
    add_model_arguments,
    bench_key,
    engine_pids,
    engine_processes,
    engine_section,
    engine_steps,
    model_name,
    percentile,
    run_on,
    serve_on_loopback,
    served_model,
)
from turns_client import Chats, Plan, run_chats, run_chats_in_subprocess

from bot.app import create_app
from bot.config import Settings, load_settings
from bot.engine.base import GenerationChunk, GenerationRequest
from bot.engine.cpu_dtype import resolve_dtype
from bot.engine.openai_remote import OpenAIRemoteEngine
from bot.engine.settings import EngineSettings
from bot.engine.vllm_local import LocalVLLMEngine
from bot.log import configure_logging
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.migrate import upgrade
from bot.storage.models import Message, Turn
from bot.storage.tokens import unpack_token_ids

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.testing.vllm_servers import API_KEY, VLLMServer, launch, wait_ready


async def stored_prompts(
    db_url: str, skipped_turns: frozenset[str] = frozenset()
) -> dict[str, list[tuple[int, list[int]]]]:
    """Per conversation: (turn seq, exact prompt ids) rebuilt from the stored history,
    leaving out the conversations of ``skipped_turns``."""
    from sqlalchemy import select

    engine = create_engine(db_url)
    prompts: dict[str, list[tuple[int, list[int]]]] = {}
    async with create_sessionmaker(engine)() as session:
        turns = (await session.scalars(select(Turn).order_by(Turn.conversation_id, Turn.seq))).all()
        for turn in turns:
            rows = (
                await session.execute(
                    select(Message.role, Message.token_ids, Message.turn_id)
                    .where(Message.conversation_id == turn.conversation_id)
                    .order_by(Message.seq)
                )
            ).all()
            prompt: list[int] = []
            for role, packed, turn_id in rows:
                prompt.extend(unpack_token_ids(packed))
                if turn_id == turn.id and role == "user":
                    break
            prompts.setdefault(turn.conversation_id, []).append((turn.seq, prompt))
        skipped = {turn.conversation_id for turn in turns if turn.id in skipped_turns}
    await engine.dispose()
    for conversation_id in skipped:
        del prompts[conversation_id]
    return prompts


class FirstTextClock:
    """An engine, noting when each request's first token and first text reach this process
    (mixed into the in-process engine, ``LocalClock``, or the remote one, ``RemoteClock``).

    A token that decodes to no text yet gives a chunk with ids and no text, which the
    service does not stream: the client's first delta waits for the engine's next steps.
    """

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)  # type: ignore[call-arg]  # the engine's, next in line
        self.text_after_token_ms: dict[str, float] = {}
        """Per request id: ms from the chunk with its first token to the one with its first text."""
        self.asked_at: dict[str, float] = {}
        """Per request id: when the service called ``generate`` (perf_counter)."""
        self.first_text_at: dict[str, float] = {}
        """Per request id: when the chunk with its first text reached the service."""
        self.to_text_ms: dict[str, float] = {}
        """Per request id: ms from the request to the chunk with its first text, all of it in
        vLLM (its engine client in this process, the engine core's queue and steps)."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        asked = time.perf_counter()
        self.asked_at[request.request_id] = asked
        first_token: float | None = None
        async for chunk in super().generate(request):  # type: ignore[misc]
            now = time.perf_counter()
            if chunk.token_ids and first_token is None:
                first_token = now
            first_text = chunk.text and request.request_id not in self.to_text_ms
            if first_text and first_token is not None:
                self.text_after_token_ms[request.request_id] = (now - first_token) * 1000
                self.to_text_ms[request.request_id] = (now - asked) * 1000
                self.first_text_at[request.request_id] = now
            yield chunk


class LocalClock(FirstTextClock, LocalVLLMEngine):
    """The in-process engine with ``FirstTextClock``'s marks."""


class RemoteClock(FirstTextClock, OpenAIRemoteEngine):
    """The engine in a vLLM server of its own with ``FirstTextClock``'s marks."""


def server_steps(server: VLLMServer) -> tuple[int, int]:
    """``engine_steps`` of a vLLM server, read off its ``/metrics``."""
    steps = server.metric("vllm:iteration_tokens_total_count")
    return int(steps), int(server.metric("vllm:iteration_tokens_total_sum"))


async def reset_prefix_cache(engine: FirstTextClock, server: VLLMServer | None) -> None:
    if server is None:
        assert isinstance(engine, LocalClock)
        await engine.llm.reset_prefix_cache()
        return
    request = urllib.request.Request(f"{server.base_url}/reset_prefix_cache", method="POST")
    request.add_header("Authorization", f"Bearer {API_KEY}")
    await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=30).close())


BURST_S = 0.010
"""Another POST sent this long before a message puts the message in a burst."""


def posts_just_before(results: list[dict[str, Any]]) -> dict[str, int]:
    """Per turn: how many other chats' POSTs were sent in the ``BURST_S`` before its own.

    Chats whose replies end in the same engine step send their next messages at once:
    the service then handles them, and those replies' final writes, one after another
    on its one loop, and the later ones in a burst wait for the earlier.
    """
    sent = sorted(r["sent_at"] for r in results)
    before: dict[str, int] = {}
    for r in results:
        at = r["sent_at"]
        earlier = bisect.bisect_left(sent, at) - bisect.bisect_left(sent, at - BURST_S)
        before[r.get("turn_id", "")] = earlier
    return before


async def direct(
    engine: FirstTextClock, prompts: list[list[int]], max_tokens: int
) -> list[tuple[float, float, float, float]]:
    """The same prompts, in order, straight to the engine, per request in ms: TTFT,
    end to end, the engine core's own queue + prefill of it, and the time to its first
    text (what a client of the engine would see first, as the engine's clock noted it)."""
    durations = []
    for prompt in prompts:
        started = time.perf_counter()
        request = GenerationRequest(
            request_id=uuid.uuid4().hex,
            prompt_token_ids=prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            top_p=1.0,
        )
        first: float | None = None
        core = 0.0
        async for chunk in engine.generate(request):
            if first is None and chunk.token_ids:
                first = time.perf_counter()
            if chunk.timings is not None:
                core = chunk.timings.queue_ms + chunk.timings.prefill_ms
        ended = time.perf_counter()
        ttft = ((first or ended) - started) * 1000
        e2e = (ended - started) * 1000
        durations.append((ttft, e2e, core, engine.to_text_ms.get(request.request_id, e2e)))
    return durations


async def main(args: argparse.Namespace) -> None:
    # Per-turn log lines to a terminal would cost the service time the engine does not pay.
    configure_logging(os.environ.get("BENCH_LOG_LEVEL", "WARNING"), "json")
    workdir = Path(tempfile.mkdtemp(prefix="bench-turns-"))
    model, dtype = served_model(args)
    db_url = f"sqlite+aiosqlite:///{workdir / 'bench.db'}"
    await asyncio.to_thread(upgrade, db_url)
    engine_settings = engine_section(model, dtype)
    server: VLLMServer | None = None
    if args.engine_server:
        # On CPU 0 with everything it starts, where the in-process engine's worker and core
        # run: the service and the client keep the other CPU in both layouts.
        server = launch(
            model,
            workdir,
            core=0,
            dtype=resolve_dtype(dtype, str(model), on_cpu=True),
            max_model_len=engine_settings["max_model_len"],
            dev_mode=True,
            pinned=True,
        )
        await asyncio.to_thread(wait_ready, server, time.monotonic())
        engine_settings.update(server.engine_section())
    settings = load_settings(
        None,
        database={"url": db_url},
        engine=engine_settings,
        generation={"max_tokens": args.max_tokens, "temperature": 0.0, "top_p": 1.0},
        logging={"level": "WARNING"},
        # The benchmark is one key sending many messages: fair use would throttle it.
        limits={"messages_per_minute": 0, "tokens_per_day": 0},
    )
    engine: LocalClock | RemoteClock = (
        RemoteClock(settings.engine) if server else LocalClock(settings.engine)
    )
    try:
        await measure(args, engine, server, settings, db_url)
    finally:
        await engine.shutdown()
        if server is not None:
            server.stop()


async def measure(
    args: argparse.Namespace,
    engine: LocalClock | RemoteClock,
    server: VLLMServer | None,
    settings: Settings,
    db_url: str,
) -> None:
    """Serve the chats through the service, send the same prompts straight to the engine,
    and print both (``server``: the engine's vLLM server, None for the engine in process)."""

    def steps() -> tuple[int, int]:
        return server_steps(server) if server else engine_steps()

    await engine.start()
    app = await create_app(settings, engine=engine)
    runner, base = await serve_on_loopback(app)

    key = await bench_key(db_url, "bench")
    warm_turns: frozenset[str] = frozenset()
    if args.warm_process:
        # Another key's chat of one turn first: the timed chats then find a process that
        # has served a turn (a conversation's first message is still cold, its key new).
        warm = Plan(1, 1, args.one_request, 0.0)
        warmed = await run_chats_in_subprocess(
            base, await bench_key(db_url, "warm"), args.loop, warm
        )
        warm_turns = frozenset(r.get("turn_id", "") for c in warmed.conversations for r in c)

    steps_before = steps()
    cpu_before = time.process_time()
    # Who had a CPU while the chats ran: 2 cores for this loop, vLLM's processes and the
    # client's. A loop thread that waits for a CPU delays every message it has read.
    api_server = {} if server is None else {"vLLM's API server": [(server.process.pid,) * 2]}
    waits = CpuWaits(
        {"service loop thread": [(os.getpid(), threading.get_native_id())]}
        | {f"{psutil.Process(pid).name()}'s main thread": [(pid, pid)] for pid in engine_pids()}
        | api_server
    )
    waits.start()
    chats: Chats
    plan = Plan(args.conversations, args.turns, args.one_request, args.pause_ms / 1000)
    if args.client_in_process:
        chats = await run_chats(base, key, plan)
    else:
        chats = await run_chats_in_subprocess(base, key, args.loop, plan)
    per_conversation, service_wall = chats.conversations, chats.wall_s
    steps_service = steps()
    cpu_service = time.process_time() - cpu_before
    waited = waits.stop()
    results = [result for conversation in per_conversation for result in conversation]
    failures = [r for r in results if r.get("kind") != "done"]

    # Same prompts straight to the engine, same concurrency, from a cold prefix cache.
    prompts = await stored_prompts(db_url, warm_turns)
    await reset_prefix_cache(engine, server)
    started = time.perf_counter()
    cpu_before = time.process_time()
    direct_times = await asyncio.gather(
        *(direct(engine, [p for _, p in seqs], args.max_tokens) for seqs in prompts.values())
    )
    direct_wall = time.perf_counter() - started
    cpu_direct = time.process_time() - cpu_before
    steps_direct = steps()

    # Cache share: turn n's cached tokens vs the full blocks of turn n-1's prompt + reply.
    cached = cacheable = 0
    recomputed: dict[int, list[int]] = {}
    ttft: dict[int, list[float]] = {}
    for conversation in per_conversation:
        for previous, current in itertools.pairwise(conversation):
            usage, before = current["usage"], previous["usage"]
            full = (before["prompt_tokens"] + before["completion_tokens"] - 1) // 32 * 32
            cacheable += full
            cached += min(usage["cached_tokens"], full)
        for result in conversation:
            usage = result["usage"]
            recomputed.setdefault(result["turn"], []).append(
                usage["prompt_tokens"] - usage["cached_tokens"]
            )
            ttft.setdefault(result["turn"], []).append(result["ttft_ms"])
    acks = [r["ack_ms"] for r in results]
    service_e2e = sum(r["e2e_ms"] for r in results)
    direct_e2e = sum(e2e for times in direct_times for _, e2e, _, _ in times)
    direct_ttft = [ttft for times in direct_times for ttft, _, _, _ in times]
    direct_core = [core for times in direct_times for _, _, core, _ in times]
    direct_to_text = [to_text for times in direct_times for _, _, _, to_text in times]
    # The same split of a direct request: what the engine client itself adds to the
    # core's queue + prefill (vLLM's hops between this process and its engine core).
    direct_client = [ttft - core for times in direct_times for ttft, _, core, _ in times]
    # The engine's part of the client's TTFT: its queue and the prefill of the prompt.
    engine_part = [
        r["timings_ms"].get("queue", 0.0) + r["timings_ms"].get("prefill", 0.0)
        for r in results
        if r.get("timings_ms")
    ]
    service_part = [
        r["ttft_ms"] - r["timings_ms"].get("queue", 0.0) - r["timings_ms"].get("prefill", 0.0)
        for r in results
        if r.get("timings_ms")
    ]
    # The engine's steps after its first token until a token decodes to text, as the
    # chunks reached the service: the client's first delta waited for them too.
    steps_to_text = [
        engine.text_after_token_ms.get(r.get("turn_id", ""), 0.0)
        for r in results
        if r.get("timings_ms")
    ]
    service_to_text = [
        part - steps for part, steps in zip(service_part, steps_to_text, strict=True)
    ]
    # All the time the turn's first text spent in vLLM, its own hops in this process
    # included (the engine TTFT sent directly has them too): what is left is the service's.
    own_by_turn = {
        r["turn_id"]: r["ttft_ms"] - engine.to_text_ms[r["turn_id"]]
        for r in results
        if r.get("turn_id") in engine.to_text_ms
    }
    service_own = list(own_by_turn.values())
    # The same by the POSTs sent just before (a burst: see ``posts_just_before``).
    within = f"within {BURST_S * 1000:g} ms after"
    places = ("sent alone", f"{within} 1 other", f"{within} 2+ others")
    in_burst: dict[str, list[float]] = {place: [] for place in places}
    burst = posts_just_before(results)
    for turn_id, own in own_by_turn.items():
        in_burst[places[min(2, burst[turn_id])]].append(own)

    # The same, split at the engine: from the POST sent to ``generate`` called (the ack,
    # the turn's start, history, prompt), and from the first text's chunk to the client's
    # first delta (the stream's hops to the client). perf_counter is one clock per host.
    service_before_engine = [
        (engine.asked_at[r["turn_id"]] - r["sent_at"]) * 1000
        for r in results
        if r.get("turn_id") in engine.first_text_at
    ]
    service_after_engine = [
        (r["first_delta_at"] - engine.first_text_at[r["turn_id"]]) * 1000
        for r in results
        if r.get("turn_id") in engine.first_text_at
    ]
    # The client library's own part of it: from ``post()`` called to the request's last
    # byte written (aiohttp builds it, takes a pooled connection, writes it).
    client_building = [
        (r["on_wire_at"] - r["sent_at"]) * 1000
        for r in results
        if r.get("turn_id") in engine.first_text_at and "on_wire_at" in r
    ]
    # A conversation's first turn is the run's coldest (its conversation created, its key
    # looked up, the chats' first messages all at once): its p99 is theirs. The rest:
    later_before_engine = [
        (engine.asked_at[r["turn_id"]] - r["sent_at"]) * 1000
        for r in results
        if r.get("turn_id") in engine.first_text_at and r["turn"] > 0
    ]
    first_before_engine = [
        (engine.asked_at[r["turn_id"]] - r["sent_at"]) * 1000
        for r in results
        if r.get("turn_id") in engine.first_text_at and r["turn"] == 0
    ]

    share = 100 * cached / max(1, cacheable)
    e2e_ratio = service_e2e / direct_e2e
    wall_ratio = service_wall / direct_wall
    print(f"# {args.conversations} conversations x {args.turns} turns, ", end="")
    print(f"max_tokens={args.max_tokens}, {model_name(args)}, CPU; load average ", end="")
    print(" ".join(f"{x:.2f}" for x in os.getloadavg()))
    if server is None:
        print(f"# engine: in the service process; {engine_processes()}")
    else:
        cpus = ",".join(map(str, sorted(psutil.Process(server.process.pid).cpu_affinity())))
        print(f"# engine: a vLLM server of its own, every process of it on CPUs {cpus}", end="")
        print(f"; {engine_processes()}")
    where = "the service's own event loop" if args.client_in_process else "a separate process"
    print(f"# HTTP client ran in {where}", end="")
    print("; each reply streamed in its POST's response" if args.one_request else "", end="")
    print(
        f"; a pause of {args.pause_ms:g} ms (mean) before each next message"
        if args.pause_ms
        else ""
    )
    print(f"turns: {len(results)} ({len(failures)} failed)")
    print(f"prefix cache: {cached}/{cacheable} cacheable prompt tokens served from cache", end="")
    print(f" = {share:.1f} % (turns 2..{args.turns})")
    print(f"ack POST /v1/messages: p50 {percentile(acks, 50):.1f} ms", end="")
    print(f", p99 {percentile(acks, 99):.1f} ms")
    print("turn  recomputed(mean)  ttft_p50_ms  ttft_p99_ms")
    for turn in sorted(ttft):
        mean_new = statistics.mean(recomputed[turn])
        p50, p99 = percentile(ttft[turn], 50), percentile(ttft[turn], 99)
        print(f"{turn + 1:>4}  {mean_new:>16.1f}  {p50:>11.1f}  {p99:>11.1f}")
    print("before the first token (ms)                 p50      p99")
    for name, values in (
        ("service (client TTFT - engine queue+prefill)", service_part),
        ("  of it, engine steps until the first text", steps_to_text),
        ("service to the first text (the rest)", service_to_text),
        ("service's own: client TTFT - time in vLLM to it", service_own),
        *((f"  {place} ({len(values)})", values) for place, values in in_burst.items() if values),
        ("  POST sent -> generate called", service_before_engine),
        ("    of it, the client's post() to on the wire", client_building),
        (f"    turns 2..{args.turns} only", later_before_engine),
        ("    first turns only", first_before_engine),
        ("  first text from vLLM -> client's first delta", service_after_engine),
        ("engine's queue + prefill in those turns", engine_part),
        ("client TTFT through the service", [r["ttft_ms"] for r in results]),
        ("engine TTFT, same prompts sent directly", direct_ttft),
        ("  its engine core queue + prefill", direct_core),
        ("  the rest (vLLM's own hops, no service)", direct_client),
        ("engine TTFT to the first text, sent directly", direct_to_text),
    ):
        print(f"{name:<45} {percentile(values, 50):>7.1f}  {percentile(values, 99):>7.1f}")
    # Where the service's part goes: the turns' own layer clocks (``turns.layer_ms``).
    layers: dict[str, list[float]] = {}
    first_layers: dict[str, list[float]] = {}
    for r in results:
        for name, value in (r.get("timings_ms") or {}).items():
            if isinstance(value, int | float):
                layers.setdefault(name, []).append(float(value))
                if r["turn"] == 0:
                    first_layers.setdefault(name, []).append(float(value))
    print("layer (turns.layer_ms)  " + "  ".join(layers))
    p50s = (f"{percentile(values, 50):.1f}" for values in layers.values())
    print("  p50 ms                " + "  ".join(p50s))
    p50s = (f"{percentile(first_layers.get(name, [0.0]), 50):.1f}" for name in layers)
    print("  first turns, p50 ms   " + "  ".join(p50s))
    print(f"end-to-end summed over turns: service {service_e2e:.0f} ms, ", end="")
    print(f"engine direct {direct_e2e:.0f} ms, ratio {e2e_ratio:.2f}")
    print(f"wall clock: service {service_wall:.2f} s, engine direct {direct_wall:.2f} s", end="")
    print(f", ratio {wall_ratio:.2f}")
    # This process's CPU (service and the engine's client side; the engine core and its
    # worker are processes of their own): what the service adds on the CPU it shares.
    print(f"this process's CPU: service {cpu_service:.2f} s, engine direct {cpu_direct:.2f} s")
    for line in waited:
        print(f"while the chats ran through the service: {line}")
    # Why the ratio: the same tokens in more, emptier steps when the chats' turns start
    # at their own times (through the service) instead of all at once (direct).
    for name, (steps, tokens), (steps_then, tokens_then), wall in (
        ("service", steps_service, steps_before, service_wall),
        ("engine direct", steps_direct, steps_service, direct_wall),
    ):
        count = max(1, steps - steps_then)
        print(f"engine steps, {name}: {count}, {(tokens - tokens_then) / count:.1f} tokens", end="")
        print(f" and {wall * 1000 / count:.2f} ms of wall clock a step")

    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=48)
    add_model_arguments(parser)
    parser.add_argument(
        "--loop", choices=LOOPS, default="asyncio", help="the service's and the client's loop"
    )
    parser.add_argument(
        "--client-in-process",
        action="store_true",
        help="run the HTTP client in the service's own event loop (not a separate process)",
    )
    parser.add_argument(
        "--one-request",
        action="store_true",
        help="each POST asks for text/event-stream and reads the reply in its own response "
        "(one request a turn, not a POST then a GET of the stream)",
    )
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="each chat waits a random time of this mean (exponential) before its next "
        "message, as a person would: the chats' turns no longer start and end in step "
        "(the wall-clock ratio then counts the pauses; the summed end-to-end does not)",
    )
    parser.add_argument(
        "--warm-process",
        action="store_true",
        help="serve one turn of another key's chat before the timed chats (not counted): "
        "their first turns then find a process that has run every statement once",
    )
    parser.add_argument(
        "--engine-server",
        action="store_true",
        help="the engine in a vLLM server of its own on CPU 0 (engine.kind = openai), "
        "not in the service's process",
    )
    arguments = parser.parse_args()
    run_on(arguments.loop, main(arguments))
