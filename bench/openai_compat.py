"""Benchmark: the same OpenAI client, the same 10-turn chats, this service vs a plain vLLM server.

Both sides get exactly what an OpenAI client sends: the whole conversation as
text on every call (``/v1/chat/completions``, streamed, with usage).

* ``vllm``: a plain vLLM OpenAI server (``--enable-prompt-tokens-details``)
  re-tokenizes the text history on every call.
* ``service``: this service, whose engine is *that same vLLM server* (driven
  with token ids), matches the text history to the stored conversation and
  extends its exact token ids.

Same server, same model, same prompts: only the path differs. The two runs use
different ``cache_salt`` values so neither profits from the other's cache.

Prints, side by side: the share of the previous prompt + reply's full blocks
served from the prefix cache (turns 2..T), prompt tokens recomputed per turn
(prompt - cached) and TTFT by turn (p50 over conversations, measured by the
client: request sent -> first content chunk).

Run:  .venv/bin/python bench/openai_compat.py --conversations 4 --turns 10 [--postgres]

With ``--postgres`` the service stores on a database of its own on the local PostgreSQL
(``BOT_BENCH_POSTGRES_DSN``, default the trust-auth server on 127.0.0.1:5432), dropped
afterwards; else on a temporary SQLite file.
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

import openai
from harness import (
    BLOCK_SIZE,
    DEMO_MODEL_DIR,
    bench_key,
    percentile,
    prefix_reuse,
    scratch_database,
    serve_on_loopback,
    service_sections,
)
from sqlalchemy import func, select

from bot.app import create_app
from bot.config import load_settings
from bot.models.demo_model import build_demo_model
from bot.ops.log import configure_logging
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation, Turn
from bot.testing.vllm_servers import API_KEY, SERVED_MODEL_NAME, launch, wait_ready

POSTGRES_ADMIN_DSN = os.environ.get(
    "BOT_BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SYSTEM_PROMPT = "You are a helpful assistant."
MAX_MODEL_LEN = 1024
USER_LINES = [
    "Hello! How are you today?",
    "Tell me about the weather in Paris this week.",
    "And what about London and Berlin?",
    "Please answer briefly and politely.",
    "What can I do for you? Numbers: 1 2 3 100.",
    "Code: def main(): return print('hello world')",
    "Markdown: **bold**, _italic_, `code`.",
    "Questions and answers, greetings and farewells.",
    "Ünïcödé and émojis 🙂 — café?",
    "Thanks, that is all.",
]


@dataclass(frozen=True)
class TurnResult:
    turn: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_ms: float


async def converse(
    client: openai.AsyncOpenAI,
    *,
    index: int,
    turns: int,
    max_tokens: int,
    system_message: bool,
    extra_body: dict[str, Any],
) -> list[TurnResult]:
    """One chat as any OpenAI client runs it: full text history re-sent on every call."""
    messages: list[Any] = [{"role": "system", "content": SYSTEM_PROMPT}] if system_message else []
    results = []
    for turn in range(turns):
        # Each conversation starts differently so conversations share only the system prompt.
        line = USER_LINES[(turn + index) % len(USER_LINES)]
        messages.append({"role": "user", "content": f"[{index}] {line}" if turn == 0 else line})
        started = time.perf_counter()
        first: float | None = None
        reply = ""
        usage = None
        stream = await client.chat.completions.create(
            model=SERVED_MODEL_NAME,
            messages=messages,
            max_tokens=max_tokens,
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


@dataclass(frozen=True)
class Summary:
    share: float
    cached: int
    cacheable: int
    recomputed_after_first: int
    recomputed_by_turn: dict[int, float]
    ttft_by_turn: dict[int, float]


def summarise(chats: list[list[TurnResult]]) -> Summary:
    cached, cacheable = prefix_reuse(
        [[(t.prompt_tokens, t.completion_tokens, t.cached_tokens) for t in chat] for chat in chats]
    )
    by_turn: dict[int, list[TurnResult]] = {}
    for result in (result for chat in chats for result in chat):
        by_turn.setdefault(result.turn, []).append(result)
    return Summary(
        share=100 * cached / max(1, cacheable),
        cached=cached,
        cacheable=cacheable,
        recomputed_after_first=sum(
            t.prompt_tokens - t.cached_tokens for turn, ts in by_turn.items() if turn for t in ts
        ),
        recomputed_by_turn={
            turn: statistics.mean(t.prompt_tokens - t.cached_tokens for t in ts)
            for turn, ts in by_turn.items()
        },
        ttft_by_turn={
            turn: percentile([t.ttft_ms for t in ts], 50) for turn, ts in by_turn.items()
        },
    )


async def run_all(client: openai.AsyncOpenAI, args: argparse.Namespace, **kw: Any) -> Summary:
    chats = await asyncio.gather(
        *(
            converse(client, index=i, turns=args.turns, max_tokens=args.max_tokens, **kw)
            for i in range(args.conversations)
        )
    )
    return summarise(list(chats))


def service_settings(db_url: str, model: Path, base_url: str, max_tokens: int) -> Any:
    engine = {
        "kind": "openai",
        "model": str(model),
        "base_urls": [base_url],
        "api_key": API_KEY,
        "served_model_name": SERVED_MODEL_NAME,
        "max_model_len": MAX_MODEL_LEN,
        "block_size": BLOCK_SIZE,
    }
    sections = service_sections(db_url, engine, max_tokens)
    return load_settings(None, **sections, chat={"system_prompt": SYSTEM_PROMPT})


def print_layers(layer_ms: list[dict[str, Any]]) -> None:
    """Where the service's time went, mean over its turns (the row's ``layer_ms``)."""
    names = sorted({name for row in layer_ms for name in row if row.get(name) is not None})
    means = {
        name: statistics.mean(row[name] for row in layer_ms if row.get(name) is not None)
        for name in names
    }
    print("service layers, mean ms: " + ", ".join(f"{n} {v:.1f}" for n, v in means.items()))


async def main(args: argparse.Namespace) -> None:
    configure_logging(os.environ.get("BENCH_LOG_LEVEL", "WARNING"), "json")
    workdir = Path(tempfile.mkdtemp(prefix="bench-openai-"))
    model = build_demo_model(Path(args.model_dir))
    server = launch(model, workdir, core=0)
    stack = contextlib.AsyncExitStack()
    try:
        await asyncio.to_thread(wait_ready, server, time.monotonic())
        server_url = POSTGRES_ADMIN_DSN if args.postgres else None
        db_url = await stack.enter_async_context(scratch_database(workdir, server_url))
        settings = service_settings(db_url, model, server.base_url, args.max_tokens)
        app = await create_app(settings)
        runner, base = await serve_on_loopback(app)
        key = await bench_key(db_url, "bench")

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
        # The service's configured system prompt opens each chat; the plain server gets it
        # as a system message, so both models see the same conversation.
        service = await run_all(service_client, args, system_message=False, extra_body={})
        vllm = await run_all(
            vllm_client, args, system_message=True, extra_body={"cache_salt": "bench-vllm"}
        )
        db = create_engine(db_url)
        async with create_sessionmaker(db)() as session:
            conversations = await session.scalar(select(func.count()).select_from(Conversation))
            layer_ms = [t.layer_ms for t in (await session.scalars(select(Turn))).all()]
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
        f"cached share of prev prompt+reply   {service.share:>8.1f} %    {vllm.share:>8.1f} %"
        f"   (turns 2..{args.turns}; {service.cached}/{service.cacheable}"
        f" vs {vllm.cached}/{vllm.cacheable})"
    )
    print(
        f"prompt tokens recomputed, turns 2.. {service.recomputed_after_first:>8}      "
        f"{vllm.recomputed_after_first:>8}"
    )
    print("turn   recomputed(mean) service / vLLM   TTFT p50 ms service / vLLM")
    for turn in sorted(service.ttft_by_turn):
        print(
            f"{turn + 1:>4}   {service.recomputed_by_turn[turn]:>12.1f} / "
            f"{vllm.recomputed_by_turn[turn]:<12.1f}   {service.ttft_by_turn[turn]:>10.1f} / "
            f"{vllm.ttft_by_turn[turn]:.1f}"
        )
    print_layers(layer_ms)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model-dir", default=str(DEMO_MODEL_DIR))
    parser.add_argument("--postgres", action="store_true", help="store on the local PostgreSQL")
    asyncio.run(main(parser.parse_args()))
