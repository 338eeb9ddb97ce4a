"""Benchmark: the same OpenAI client and chats, this service against a plain vLLM server.

Both get what an OpenAI client sends: the whole conversation as text on every call
(``/v1/chat/completions``, streamed, with usage). The plain server (``vllm``) re-tokenizes
that text every call; the service, whose engine is that same server (driven with token
ids), matches it to the stored conversation and extends its exact token ids. The two runs
use different ``cache_salt`` values. Prints side by side the share of the previous prompt
+ reply's full blocks served from the prefix cache, prompt tokens recomputed and the
client's TTFT by turn. ``--postgres`` stores on a database of its own on the local
PostgreSQL (``BOT_TEST_POSTGRES_DSN``), dropped afterwards.

Run:  .venv/bin/python bench/openai_compat.py --conversations 4 --turns 10 [--postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
import openai
from sqlalchemy import func, select

from bot.app import create_app
from bot.config import load_settings
from bot.models.demo_model import build_demo_model
from bot.ops.log import configure_logging
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation
from bot.testing.vllm_servers import API_KEY, SERVED_MODEL_NAME, VLLMServer, launch, wait_ready

SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass(frozen=True)
class TurnResult:
    turn: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_ms: float


async def converse(
    client: openai.AsyncOpenAI, index: int, args: argparse.Namespace, extra_body: dict[str, Any]
) -> list[TurnResult]:
    """One chat as any OpenAI client runs it: full text history re-sent on every call. The
    service's configured system prompt opens each chat; the plain server gets it as a system
    message, so both models see the same conversation."""
    system_message = "cache_salt" in extra_body  # the plain server
    messages: list[Any] = [{"role": "system", "content": SYSTEM_PROMPT}] if system_message else []
    results = []
    for turn in range(args.turns):
        # Each conversation starts differently so conversations share only the system prompt.
        line = harness.USER_LINES[(turn + index) % len(harness.USER_LINES)]
        messages.append({"role": "user", "content": f"[{index}] {line}" if turn == 0 else line})
        started = time.perf_counter()
        first: float | None = None
        reply = ""
        usage = None
        stream = await client.chat.completions.create(
            model=SERVED_MODEL_NAME,
            messages=messages,
            max_tokens=args.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra_body,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter()
                reply += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None, "no usage chunk"
        details = usage.prompt_tokens_details
        cached = (details.cached_tokens or 0) if details is not None else 0
        ttft = ((first or time.perf_counter()) - started) * 1000
        results.append(TurnResult(turn, usage.prompt_tokens, cached, usage.completion_tokens, ttft))
        messages.append({"role": "assistant", "content": reply})
    return results


def summarise(chats: list[list[TurnResult]]) -> dict[str, Any]:
    """The prefix-cache share, and per turn the mean tokens recomputed and the TTFT p50."""
    usage = [[(t.prompt_tokens, t.completion_tokens, t.cached_tokens) for t in c] for c in chats]
    cached, cacheable = harness.prefix_reuse(usage)
    by_turn = [[chat[turn] for chat in chats] for turn in range(len(chats[0]))]
    return {
        "share": 100 * cached / max(1, cacheable),
        "tokens": f"{cached}/{cacheable}",
        "recomputed": sum(t.prompt_tokens - t.cached_tokens for ts in by_turn[1:] for t in ts),
        "recomputed_by_turn": [
            statistics.mean(t.prompt_tokens - t.cached_tokens for t in ts) for ts in by_turn
        ],
        "ttft_by_turn": [harness.percentile([t.ttft_ms for t in ts], 50) for ts in by_turn],
    }


async def run_all(client: openai.AsyncOpenAI, args: argparse.Namespace, **kw: Any) -> Any:
    chats = (converse(client, i, args, **kw) for i in range(args.conversations))
    return summarise(list(await asyncio.gather(*chats)))


def service_settings(db_url: str, model: Path, server: VLLMServer, max_tokens: int) -> Any:
    engine = server.engine_section() | {"model": str(model), "block_size": harness.BLOCK_SIZE}
    sections = harness.service_sections(db_url, engine, max_tokens)
    return load_settings(None, **sections, chat={"system_prompt": SYSTEM_PROMPT})


async def main(args: argparse.Namespace) -> None:
    configure_logging(os.environ.get("BENCH_LOG_LEVEL", "WARNING"), "json")
    workdir = Path(tempfile.mkdtemp(prefix="bench-openai-"))
    model = build_demo_model(Path(args.model_dir))
    server = launch(model, workdir, core=0)
    stack = contextlib.AsyncExitStack()
    try:
        await asyncio.to_thread(wait_ready, server, time.monotonic())
        server_url = harness.POSTGRES if args.postgres else None
        db_url = await stack.enter_async_context(harness.scratch_database(workdir, server_url))
        settings = service_settings(db_url, model, server, args.max_tokens)
        app = await create_app(settings)
        runner, base = await harness.serve_on_loopback(app)
        key = await harness.bench_key(db_url, "bench")

        service_client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        vllm_client = openai.AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0
        )
        # One throwaway turn on each path first: connection set-up and first-request
        # costs are not what this measures.
        for client, salt in ((service_client, {}), (vllm_client, {"cache_salt": "warm-up"})):
            await client.chat.completions.create(
                model=SERVED_MODEL_NAME,
                messages=[{"role": "user", "content": "warm up"}],
                max_tokens=1,
                extra_body=salt,
            )
        service = await run_all(service_client, args, extra_body={})
        vllm = await run_all(vllm_client, args, extra_body={"cache_salt": "bench-vllm"})
        db = create_engine(db_url)
        async with create_sessionmaker(db)() as session:
            conversations = await session.scalar(select(func.count()).select_from(Conversation))
        await db.dispose()
        await runner.cleanup()
    finally:
        await stack.aclose()
        server.stop()

    print(
        f"# {args.conversations} conversations x {args.turns} turns, max_tokens={args.max_tokens},"
    )
    print("# demo model on one vLLM OpenAI server (CPU), full text history re-sent every call;")
    print(f"# service database: {'PostgreSQL' if args.postgres else 'SQLite'}")
    print(
        f"service conversations stored: {conversations - 1} "
        f"(one per chat when every turn matched; warm-up not counted)"
    )
    print("                                      service        plain vLLM")
    print(
        f"cached share of prev prompt+reply   {service['share']:>8.1f} %    {vllm['share']:>8.1f} %"
        f"   (turns 2..{args.turns}; {service['tokens']} vs {vllm['tokens']})"
    )
    print(
        f"prompt tokens recomputed, turns 2.. {service['recomputed']:>8}      "
        f"{vllm['recomputed']:>8}"
    )
    print("turn   recomputed(mean) service / vLLM   TTFT p50 ms service / vLLM")
    for turn in range(args.turns):
        print(
            f"{turn + 1:>4}   {service['recomputed_by_turn'][turn]:>12.1f} / "
            f"{vllm['recomputed_by_turn'][turn]:<12.1f}   {service['ttft_by_turn'][turn]:>10.1f} / "
            f"{vllm['ttft_by_turn'][turn]:.1f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model-dir", default=str(harness.DEMO_MODEL_DIR))
    parser.add_argument("--postgres", action="store_true", help="store on the local PostgreSQL")
    asyncio.run(main(parser.parse_args()))
