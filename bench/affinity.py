"""Benchmark: conversation affinity vs round-robin over two real vLLM replicas, in one run.

Two vLLM OpenAI servers on loopback (the demo model) get the same shape of conversations
(N chats x T turns, token-exact prompts) twice, with different texts: routed by
``OpenAIRemoteEngine`` (rendezvous affinity on the conversation id) and round-robin.
Prints, per mode: the share of cacheable prompt tokens (full blocks of the previous
prompt + reply) served from cache, prompt tokens recomputed per turn, TTFT p50/p99.

With ``--router POLICY ...`` the same conversations also go through vLLM's own
router (``vllm-router``, the ``router`` extra) started with each policy in
front of the two servers, the service's one engine URL the router's; for
``consistent_hash`` once more without the session header (the router then
hashes each request's own id). A last table puts every mode's reuse side by
side.

    .venv/bin/python bench/affinity.py [--chats 8] [--turns 8] [--max-tokens 48]
        [--router consistent_hash sticky_least_loaded cache_aware]
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
from bot.testing.vllm_router import ROUTER_POLICIES, start_router
from bot.testing.vllm_servers import API_KEY, SERVED_MODEL_NAME, start_servers
from bot.turns.chat_format import ChatFormat, load_tokenizer

Turn = tuple[int, int, int, float]
"""prompt tokens, completion tokens, cached tokens, TTFT ms"""


NO_SESSION_HEADER = "x-bench-unrouted"
"""A header no router reads: the requests go out without the session key the router needs."""


def settings(urls: list[str], session_header: str = "x-session-id") -> EngineSettings:
    return EngineSettings(
        kind="openai",
        base_urls=urls,
        api_key=SecretStr(API_KEY),
        served_model_name=SERVED_MODEL_NAME,
        max_model_len=1024,
        session_header=session_header,
    )


async def play(
    mode: str, engines: list[OpenAIRemoteEngine], chat: ChatFormat, args: argparse.Namespace
) -> list[list[Turn]]:
    """Every chat's turns, all chats at once: the next of ``engines[1:]`` each turn
    (round-robin), else ``engines[0]`` for every turn (affinity, a router)."""
    round_robin = itertools.cycle(engines[1:])

    async def conversation(index: int) -> list[Turn]:
        turns: list[Turn] = []
        prompt = chat.first_turn(f"[{mode}] Chat {index}: hello, tell me something.").token_ids
        for turn in range(args.turns):
            engine = next(round_robin) if mode == "round-robin" else engines[0]
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


def reuse(chats: list[list[Turn]]) -> float:
    cached, cacheable = prefix_reuse([[turn[:3] for turn in chat] for chat in chats])
    return cached / max(1, cacheable)


def report(mode: str, chats: list[list[Turn]]) -> None:
    later = [turn for chat in chats for turn in chat[1:]]
    ttft = [turn[3] for turn in later]
    print(f"\n== {mode}")
    print(f"cacheable prompt tokens served from cache (turns 2..): {reuse(chats):.1%}")
    recomputed = [prompt - hit for prompt, _, hit, _ in later]
    print(f"prompt tokens recomputed per turn (turns 2..): mean {statistics.mean(recomputed):.1f}")
    print(f"TTFT turns 2..: p50 {percentile(ttft, 50):.1f} ms, p99 {percentile(ttft, 99):.1f} ms")
    by_turn = "  ".join(
        f"t{turn + 1}:{percentile([chat[turn][3] for chat in chats], 50):.0f}"
        for turn in range(len(chats[0]))
    )
    print(f"TTFT p50 by turn (ms): {by_turn}")


def router_engines(routers: dict[str, str]) -> dict[str, OpenAIRemoteEngine]:
    """Mode -> an engine whose one URL is a router: each policy with the session header,
    and consistent_hash once more without it."""
    engines = {
        f"router {policy}": OpenAIRemoteEngine(settings([url])) for policy, url in routers.items()
    }
    if "consistent_hash" in routers:
        engines["router consistent_hash, no session header"] = OpenAIRemoteEngine(
            settings([routers["consistent_hash"]], session_header=NO_SESSION_HEADER)
        )
    return engines


async def main_async(
    args: argparse.Namespace, urls: list[str], model_dir: Path, routers: dict[str, str]
) -> None:
    chat = ChatFormat(load_tokenizer(str(model_dir)), "You are a benchmark assistant.")
    routed = OpenAIRemoteEngine(settings(urls))
    singles = [OpenAIRemoteEngine(settings([url])) for url in urls]
    behind = router_engines(routers)
    for engine in (routed, *singles, *behind.values()):
        await engine.start()
    try:
        results = {
            "affinity": await play("affinity", [routed], chat, args),
            "round-robin": await play("round-robin", [routed, *singles], chat, args),
        }
        for mode, engine in behind.items():
            results[mode] = await play(mode, [engine], chat, args)
        print(f"\n{args.chats} chats x {args.turns} turns, {args.max_tokens}-token replies")
        for mode, chats in results.items():
            report(mode, chats)
        print("\n== cacheable prompt tokens served from cache, side by side")
        for mode, chats in results.items():
            print(f"{mode:<45} {reuse(chats):6.1%}")
    finally:
        for engine in (routed, *singles, *behind.values()):
            await engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--model-dir", type=Path, default=DEMO_MODEL_DIR)
    parser.add_argument(
        "--router",
        nargs="+",
        default=[],
        choices=ROUTER_POLICIES,
        metavar="POLICY",
        help=f"also through vllm-router with each policy ({', '.join(ROUTER_POLICIES)})",
    )
    args = parser.parse_args()
    model_dir = build_demo_model(args.model_dir)
    with tempfile.TemporaryDirectory() as logs:
        servers = start_servers(model_dir, Path(logs))
        print(f"two vLLM servers up in {max(s.started_s for s in servers):.1f} s")
        urls = [s.base_url for s in servers]
        routers = []
        try:
            routers = [start_router(urls, Path(logs), policy=policy) for policy in args.router]
            by_policy = {router.policy: router.base_url for router in routers}
            asyncio.run(main_async(args, urls, model_dir, by_policy))
        finally:
            for router in routers:
                router.stop()
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
