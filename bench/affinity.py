"""Conversation affinity vs round-robin over two real vLLM replicas, side by side in one run.

Starts two vLLM OpenAI servers on loopback (the tiny demo model), then plays
the same shape of conversations (N chats x T turns, token-exact prompts)
twice: routed by ``OpenAIRemoteEngine`` (rendezvous affinity on the
conversation id) and round-robin (each request to the next replica). The two
phases use different texts, so neither warms the other's cache. Prints, per
mode: the share of cacheable prompt tokens (full blocks of the previous
prompt + reply) served from cache, prompt tokens recomputed per turn, and
TTFT (p50/p99, and by turn).

    .venv/bin/python bench/affinity.py [--chats 8] [--turns 8] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.config import EngineSettings
from bot.demo_model import build_demo_model
from bot.engine.base import GenerationRequest
from bot.engine.openai_remote import OpenAIRemoteEngine
from bot.testing.vllm_servers import API_KEY, SERVED_MODEL_NAME, start_servers
from bot.turns.chat_format import ChatFormat, load_tokenizer

BLOCK = 32


@dataclass
class Stats:
    cacheable: int = 0
    cached: int = 0
    recomputed: list[int] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    ttft_by_turn: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))


def settings(urls: list[str]) -> EngineSettings:
    return EngineSettings(
        kind="openai",
        base_urls=urls,
        api_key=SecretStr(API_KEY),
        served_model_name=SERVED_MODEL_NAME,
        max_model_len=1024,
    )


async def play(
    mode: str,
    engines: list[OpenAIRemoteEngine],
    chat: ChatFormat,
    chats: int,
    turns: int,
    max_tokens: int,
) -> Stats:
    stats = Stats()
    round_robin = itertools.cycle(engines[1:])

    async def conversation(index: int) -> None:
        key = f"{mode}-chat-{index}"
        prompt = chat.first_turn(f"[{mode}] Chat {index}: hello, tell me something.").token_ids
        previous: tuple[int, int] | None = None
        for turn in range(turns):
            engine = engines[0] if mode == "affinity" else next(round_robin)
            request = GenerationRequest(
                request_id=uuid.uuid4().hex,
                prompt_token_ids=prompt,
                max_tokens=max_tokens,
                temperature=0.0,
                top_p=1.0,
                session_key=key,
            )
            started = time.perf_counter()
            first: float | None = None
            generated: list[int] = []
            cached = 0
            async for chunk in engine.generate(request):
                if chunk.token_ids and first is None:
                    first = time.perf_counter()
                generated.extend(chunk.token_ids)
                if chunk.finished:
                    cached = chunk.cached_tokens or 0
            ttft = ((first or time.perf_counter()) - started) * 1000
            if previous is not None:
                cacheable = (previous[0] + previous[1] - 1) // BLOCK * BLOCK
                stats.cacheable += cacheable
                stats.cached += min(cached, cacheable)
                stats.recomputed.append(len(prompt) - cached)
                stats.ttft_ms.append(ttft)
            stats.ttft_by_turn[turn].append(ttft)
            previous = (len(prompt), len(generated))
            prompt = prompt + generated + chat.next_turn(generated, f"turn {turn}: go on").token_ids

    await asyncio.gather(*(conversation(i) for i in range(chats)))
    return stats


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(mode: str, stats: Stats) -> None:
    share = stats.cached / stats.cacheable if stats.cacheable else 0.0
    print(f"\n== {mode}")
    print(f"cacheable prompt tokens served from cache (turns 2..): {share:.1%}")
    print(
        "prompt tokens recomputed per turn (turns 2..): "
        f"mean {statistics.mean(stats.recomputed):.1f}, total {sum(stats.recomputed)}"
    )
    print(
        f"TTFT turns 2..: p50 {pct(stats.ttft_ms, 0.5):.1f} ms, "
        f"p99 {pct(stats.ttft_ms, 0.99):.1f} ms"
    )
    by_turn = "  ".join(
        f"t{turn + 1}:{statistics.median(values):.0f}"
        for turn, values in sorted(stats.ttft_by_turn.items())
    )
    print(f"TTFT p50 by turn (ms): {by_turn}")


async def main_async(args: argparse.Namespace, urls: list[str], model_dir: Path) -> None:
    chat = ChatFormat(load_tokenizer(str(model_dir)), "You are a benchmark assistant.")
    routed = OpenAIRemoteEngine(settings(urls))
    singles = [OpenAIRemoteEngine(settings([url])) for url in urls]
    for engine in (routed, *singles):
        await engine.start()
    try:
        results = {}
        for mode, engines in (("affinity", [routed]), ("round-robin", [routed, *singles])):
            results[mode] = await play(mode, engines, chat, args.chats, args.turns, args.max_tokens)
        print(
            f"\n{args.chats} chats x {args.turns} turns, "
            f"{args.max_tokens}-token replies, block {BLOCK}"
        )
        for mode, stats in results.items():
            report(mode, stats)
    finally:
        for engine in (routed, *singles):
            await engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--model-dir", type=Path, default=Path("data/demo-model"))
    args = parser.parse_args()
    model_dir = build_demo_model(args.model_dir)
    with tempfile.TemporaryDirectory() as logs:
        servers = start_servers(model_dir, Path(logs))
        print(f"two vLLM servers up in {max(s.started_s for s in servers):.1f} s")
        try:
            asyncio.run(main_async(args, [s.base_url for s in servers], model_dir))
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
