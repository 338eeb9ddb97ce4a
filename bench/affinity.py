"""Benchmark: conversation affinity vs round-robin over two real vLLM replicas, in one run.

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
import tempfile
import time
import uuid
from pathlib import Path

from harness import DEMO_MODEL_DIR, percentile, prefix_reuse
from pydantic import SecretStr

from bot.config import EngineSettings
from bot.engine.base import GenerationRequest
from bot.engine.openai_remote import OpenAIRemoteEngine
from bot.models.demo_model import build_demo_model
from bot.testing.vllm_servers import API_KEY, SERVED_MODEL_NAME, start_servers
from bot.turns.chat_format import ChatFormat, load_tokenizer

Turn = tuple[int, int, int, float]
"""prompt tokens, completion tokens, cached tokens, TTFT ms"""


def settings(urls: list[str]) -> EngineSettings:
    return EngineSettings(
        kind="openai",
        base_urls=urls,
        api_key=SecretStr(API_KEY),
        served_model_name=SERVED_MODEL_NAME,
        max_model_len=1024,
    )


async def play(
    mode: str, engines: list[OpenAIRemoteEngine], chat: ChatFormat, args: argparse.Namespace
) -> list[list[Turn]]:
    """Every chat's turns, all chats at once: ``engines[0]`` for every turn (affinity), or
    the next of ``engines[1:]`` each turn (round-robin)."""
    round_robin = itertools.cycle(engines[1:])

    async def conversation(index: int) -> list[Turn]:
        turns: list[Turn] = []
        prompt = chat.first_turn(f"[{mode}] Chat {index}: hello, tell me something.").token_ids
        for turn in range(args.turns):
            engine = engines[0] if mode == "affinity" else next(round_robin)
            request = GenerationRequest(
                request_id=uuid.uuid4().hex,
                prompt_token_ids=prompt,
                max_tokens=args.max_tokens,
                temperature=0.0,
                top_p=1.0,
                session_key=f"{mode}-chat-{index}",
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
            turns.append((len(prompt), len(generated), cached, ttft))
            prompt = prompt + generated + chat.next_turn(generated, f"turn {turn}: go on").token_ids
        return turns

    return list(await asyncio.gather(*(conversation(i) for i in range(args.chats))))


def report(mode: str, chats: list[list[Turn]]) -> None:
    cached, cacheable = prefix_reuse([[turn[:3] for turn in chat] for chat in chats])
    later = [turn for chat in chats for turn in chat[1:]]
    ttft = [turn[3] for turn in later]
    print(f"\n== {mode}")
    print(
        f"cacheable prompt tokens served from cache (turns 2..): {cached / max(1, cacheable):.1%}"
    )
    recomputed = [prompt - hit for prompt, _, hit, _ in later]
    print(f"prompt tokens recomputed per turn (turns 2..): mean {statistics.mean(recomputed):.1f}")
    print(f"TTFT turns 2..: p50 {percentile(ttft, 50):.1f} ms, p99 {percentile(ttft, 99):.1f} ms")
    by_turn = "  ".join(
        f"t{turn + 1}:{percentile([chat[turn][3] for chat in chats], 50):.0f}"
        for turn in range(len(chats[0]))
    )
    print(f"TTFT p50 by turn (ms): {by_turn}")


async def main_async(args: argparse.Namespace, urls: list[str], model_dir: Path) -> None:
    chat = ChatFormat(load_tokenizer(str(model_dir)), "You are a benchmark assistant.")
    routed = OpenAIRemoteEngine(settings(urls))
    singles = [OpenAIRemoteEngine(settings([url])) for url in urls]
    for engine in (routed, *singles):
        await engine.start()
    try:
        affinity = await play("affinity", [routed], chat, args)
        round_robin = await play("round-robin", [routed, *singles], chat, args)
        print(f"\n{args.chats} chats x {args.turns} turns, {args.max_tokens}-token replies")
        report("affinity", affinity)
        report("round-robin", round_robin)
    finally:
        for engine in (routed, *singles):
            await engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--model-dir", type=Path, default=DEMO_MODEL_DIR)
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
