"""Benchmark: long chats under three context policies, side by side on the same conversations.

* ``compaction``: this service (the real app on SQLite): token-exact history, rebuilt once
  prompt + max_tokens passes the high watermark, the next base prepared ahead;
* ``rolling-k``: the last k messages re-rendered with the chat template every turn (how
  many bots keep long chats in context);
* ``no-limit``: token-exact full history, never trimmed: fails once the window is full.

All run on one in-process vLLM engine, each on its own cache salt. Per policy: the share of
cacheable prompt tokens (the previous prompt + reply's full blocks, capped by the current
prompt's) served from the prefix cache, prompt tokens recomputed and TTFT (the engine's
queue + prefill) by turn, failed turns and compactions. For compaction, once per pace
(``--pause``: back to back, then with pauses): the cache share of what lies on the turns'
way (their requests, and summaries made inside them), the switching turns' TTFT (message
received to first token, as the service measured it) and ``compact`` layer next to the
other turns', and the requests made off the turns. ``--no-prepare`` makes every next base
inside its switching turn instead.

Run:  .venv/bin/python bench/long_chats.py --conversations 4 --turns 60
      .venv/bin/python bench/long_chats.py --conversations 2 --turns 120 --max-tokens 48 \
          --compaction-only [--pause 0] [--pause 1] [--no-prepare]
      .venv/bin/python bench/long_chats.py --hidden 512 --layers 8   # prefill shows in TTFT
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from harness import NO_LIMITS, bench_key, greedy, percentile, scratch_database
from sqlalchemy import select

from bot.app import create_app
from bot.config import EngineSettings, load_settings
from bot.engine.base import GenerationChunk, GenerationRequest
from bot.engine.vllm_local import LocalVLLMEngine
from bot.models.demo_model import build_demo_model
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Turn
from bot.turns.chat_format import ChatFormat, load_tokenizer

SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly."
USER_LINES = [
    "Hello! How are you today?",
    "Tell me about the weather in Paris this week, and whether I need an umbrella.",
    "And what about London and Berlin?",
    "Please answer briefly and politely.",
    "What can I do for you? Numbers: 1 2 3 100.",
    "Code: def main(): return print('hello world')",
    "Markdown: **bold**, _italic_, `code`, and a list: one, two, three.",
    "Questions and answers, greetings and farewells.",
    "Can you compare the three cities by price, food and museums?",
]
MARKS = (1, 2, 5, 10, 15, 20, 30, 40, 50, 60, 80, 100)
"""The turns whose recomputed tokens and TTFT are printed."""


@dataclass
class TurnRecord:
    prompt: int
    cached: int = 0
    generated: int = 0
    ttft_ms: float = float("nan")
    failed: bool = False
    compact_ms: float = 0.0
    service_ttft_ms: float = float("nan")
    """First token - message received, as the service measured it (``turns.layer_ms``)."""
    summary: tuple[int, int] = (0, 0)
    """(prompt, cached) of a summary request made inside the turn (on its critical path)."""
    kind: str = "other turns"
    """``switching`` to a new base (it has a compaction), ``due, went on uncompacted`` (its
    prompt still fit and the next base was not ready), or ``other turns``."""


@dataclass
class PolicyResult:
    name: str
    chats: list[list[TurnRecord]] = field(default_factory=list)
    background: list[tuple[int, int]] = field(default_factory=list)
    """(prompt, cached) of requests made off the turns (base preparation and its prefills)."""


class Recorder(LocalVLLMEngine):
    """The in-process engine, keeping each request's prompt size and final chunk (cache,
    timings)."""

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self.finals: dict[str, tuple[int, GenerationChunk]] = {}

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        async for chunk in super().generate(request):
            if chunk.finished:
                self.finals[request.request_id] = (len(request.prompt_token_ids), chunk)
            yield chunk


def user_line(chat: int, turn: int) -> str:
    return f"[{chat}.{turn}] {USER_LINES[(chat * 3 + turn) % len(USER_LINES)]}"


def engine_record(prompt: int, chunk: GenerationChunk, generated: int) -> TurnRecord:
    timings = chunk.timings
    ttft = timings.queue_ms + timings.prefill_ms if timings else float("nan")
    return TurnRecord(prompt, chunk.cached_tokens or 0, generated, ttft)


async def run_plain(
    engine: LocalVLLMEngine, fmt: ChatFormat, args: argparse.Namespace, window: int | None
) -> PolicyResult:
    """The rolling window of ``window`` messages, or (None) the full token-exact history."""
    result = PolicyResult(f"rolling-{window}" if window else "no-limit")
    for chat in range(args.conversations):
        records: list[TurnRecord] = []
        messages: list[dict[str, str]] = []
        history: list[int] = []
        generated: list[int] = []
        for turn in range(args.turns):
            content = user_line(chat, turn)
            if window:
                messages.append({"role": "user", "content": content})
                rendered = [{"role": "system", "content": SYSTEM_PROMPT}, *messages[-window:]]
                prompt = fmt.render_ids(rendered, add_generation_prompt=True)
            else:
                user = fmt.next_turn(generated, content) if history else fmt.first_turn(content)
                prompt = history + user.token_ids
                if len(prompt) + args.max_tokens > engine.max_model_len:
                    records.append(TurnRecord(len(prompt), failed=True))  # context_overflow
                    continue
            request = greedy(prompt, args.max_tokens, cache_salt=f"{result.name}-{chat}")
            generated, text = [], ""
            async for chunk in engine.generate(request):
                generated.extend(chunk.token_ids)
                text += chunk.text
            messages.append({"role": "assistant", "content": text})
            history = prompt + generated
            records.append(engine_record(len(prompt), chunk, len(generated)))
        result.chats.append(records)
    return result


def pace_name(pause_s: float) -> str:
    return "back to back" if not pause_s else f"{pause_s:g} s pauses"


async def run_compaction(
    engine: Recorder, fmt: ChatFormat, sections: dict[str, Any], args: argparse.Namespace,
    workdir: Path, pause_s: float,
) -> PolicyResult:  # fmt: skip
    """This service's turns, one conversation after the other; ``pause_s`` between a reply's
    end and the next message (0: back to back, as a client replaying a history sends them)."""
    await asyncio.to_thread(workdir.mkdir)
    async with scratch_database(workdir, None) as url:
        settings = load_settings(None, database={"url": url}, **sections)
        # An owner per pace: its own cache salt, so no run finds another's blocks.
        key = await bench_key(url, "bench", owner=f"bench-compaction-{pause_s:g}")
        app = await create_app(settings, engine=engine, chat_format=fmt)
        client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        try:
            for chat in range(args.conversations):
                for turn in range(args.turns):
                    body = {"conversation_id": f"chat-{chat}", "message_id": f"m{turn}"}
                    response = await client.post(
                        "/v1/messages",
                        json=body | {"text": user_line(chat, turn)},
                        headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"},
                    )
                    await response.read()
                    await asyncio.sleep(pause_s)
        finally:
            await client.close()
        db = create_engine(url)
        async with create_sessionmaker(db)() as session:
            rows = await session.scalars(select(Turn).order_by(Turn.conversation_id, Turn.seq))
            turns = list(rows.all())
        await db.dispose()
    result = PolicyResult(f"compaction, {pace_name(pause_s)}")
    by_chat: dict[str, list[TurnRecord]] = {}
    for row in turns:
        final = engine.finals.get(row.id)
        if row.status != "done" or final is None:
            record = TurnRecord(row.prompt_tokens or 0, failed=True)
        else:
            record = engine_record(final[0], final[1], row.completion_tokens or 0)
            layers = row.layer_ms or {}
            record.compact_ms = float(layers.get("compact", 0.0))
            record.service_ttft_ms = float(layers.get("ttft") or "nan")
            if row.compaction_id is not None:
                record.kind = "switching"
            elif record.compact_ms > 0:
                record.kind = "due, went on uncompacted"
            if summary := engine.finals.get(f"{row.id}:summary"):
                record.summary = (summary[0], summary[1].cached_tokens or 0)
        by_chat.setdefault(row.conversation_id, []).append(record)
    result.chats = list(by_chat.values())
    result.background = [
        (prompt, chunk.cached_tokens or 0)
        for request_id, (prompt, chunk) in engine.finals.items()
        if request_id.startswith("prepare-")
    ]
    return result


def reuse(records: list[TurnRecord], block: int) -> tuple[int, int]:
    """(cached, cacheable) over a chat's turns after the first."""
    cached = possible = 0
    for previous, record in itertools.pairwise(records):
        if record.failed or previous.failed:
            continue
        can = (previous.prompt + previous.generated - 1) // block * block
        can = min(can, (record.prompt - 1) // block * block)
        cached, possible = cached + min(record.cached, can), possible + can
    return cached, possible


def critical_path(result: PolicyResult, block: int) -> list[str]:
    """What the user waits for: the cache share of the requests on the turns' way (a summary
    made inside a turn counts with all its whole blocks as cacheable: that work belongs off
    the turn), and switching turns next to the others."""
    cached, possible = map(sum, zip(*(reuse(chat, block) for chat in result.chats), strict=True))
    summaries = [r.summary for chat in result.chats for r in chat if r.summary[0]]
    possible += sum((prompt - 1) // block * block for prompt, _ in summaries)
    cached += sum(hit for _, hit in summaries)
    pad = " " * 11
    lines = [
        f"{pad} critical path: {cached} of {possible} cacheable tokens from cache "
        f"({100 * cached / max(possible, 1):.1f} %); switching turns that waited for their "
        f"summary: {len(summaries)}",
        f"{pad} {'turns after the first':<24} count  TTFT ms p50 / p90 / max"
        "   compact ms p50 / max",
    ]
    later = [r for chat in result.chats for r in chat[1:] if not r.failed]
    medians = {}
    for label in ("switching", "due, went on uncompacted", "other turns"):
        picked = [r for r in later if r.kind == label]
        if picked:
            ttft, compact = [r.service_ttft_ms for r in picked], [r.compact_ms for r in picked]
            medians[label] = statistics.median(ttft)
            lines.append(
                f"{pad} {label:<24} {len(picked):>5}  {medians[label]:7.1f} / "
                f"{percentile(ttft, 90):6.1f} / {max(ttft):6.1f}   "
                f"{statistics.median(compact):8.2f} / {max(compact):7.2f}"
            )
    if "switching" in medians and "other turns" in medians:
        ratio = medians["switching"] / medians["other turns"]
        lines.append(f"{pad} switching turns' TTFT p50 / other turns': {ratio:.2f}x")
    if result.background:
        lines.append(
            f"{pad} off the turns: {len(result.background)} requests (base summaries and "
            f"prefills), {sum(p for p, _ in result.background)} prompt tokens, "
            f"{sum(c for _, c in result.background)} from cache"
        )
    return lines


def summarise(result: PolicyResult, block: int, marks: Sequence[int]) -> list[str]:
    served = [r for chat in result.chats for r in chat if not r.failed]
    failed = sum(len(chat) for chat in result.chats) - len(served)
    cached, possible = map(sum, zip(*(reuse(chat, block) for chat in result.chats), strict=True))
    recomputed = sum(r.prompt - r.cached for r in served)
    compactions = sum(r.kind == "switching" for r in served)
    line = (
        f"{result.name:<11} cache share {100 * cached / max(possible, 1):6.1f} %   recomputed "
        f"{recomputed:7d} tokens ({recomputed / max(len(served), 1):6.1f}/turn)   prompt "
        f"{sum(r.prompt for r in served) / max(len(served), 1):5.0f}/turn   failed turns "
        f"{failed:4d}" + (f"   compactions {compactions}" if compactions else "")
    )
    recomputed_at, ttft_at = [], []
    for mark in marks:
        at = [chat[mark - 1] for chat in result.chats if not chat[mark - 1].failed]
        recomputed_at.append(
            f"{statistics.mean(r.prompt - r.cached for r in at):7.0f}" if at else f"{'fail':>7}"
        )
        ttft_at.append(f"{statistics.median(r.ttft_ms for r in at):7.1f}" if at else f"{'fail':>7}")
    lines = [
        line,
        f"{'':<11} recomputed/turn at turn  " + " ".join(recomputed_at),
        f"{'':<11} TTFT p50 ms at turn      " + " ".join(ttft_at),
    ]
    return lines + (critical_path(result, block) if result.name.startswith("compaction") else [])


async def main_async(args: argparse.Namespace) -> None:
    model_dir = Path(args.model)
    if args.hidden or args.layers:
        # A bigger random model, so that prefill (what the cache saves) shows in TTFT; the
        # builder reads its sizes from module constants.
        from bot import demo_model

        demo_model.DEMO_HIDDEN_SIZE = args.hidden or demo_model.DEMO_HIDDEN_SIZE
        demo_model.DEMO_LAYERS = args.layers or demo_model.DEMO_LAYERS
        demo_model.DEMO_HEADS = max(2, demo_model.DEMO_HIDDEN_SIZE // 64)
        sizes = f"h{demo_model.DEMO_HIDDEN_SIZE}-l{demo_model.DEMO_LAYERS}"
        model_dir = Path(f"data/bench-model-{sizes}")
    model_dir = build_demo_model(model_dir)
    engine_settings = EngineSettings(
        model=str(model_dir),
        dtype="float32",
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        enforce_eager=True,
        cpu_kvcache_space_gib=2,
    )
    engine = Recorder(engine_settings)
    await engine.start()
    fmt = ChatFormat(load_tokenizer(str(model_dir)), SYSTEM_PROMPT)
    compaction = {"high_watermark": args.high, "low_watermark": args.low}
    compaction |= {"summary": not args.no_summary, "summary_max_tokens": args.summary_max_tokens}
    compaction |= {"prepare_ahead": not args.no_prepare}
    compaction |= {"prepare_watermark": args.prepare} if args.prepare else {}
    sections: dict[str, Any] = {
        "engine": engine_settings.model_dump(mode="json"),
        "generation": {"max_tokens": args.max_tokens, "temperature": 0.0, "top_p": 1.0},
        "chat": {"system_prompt": SYSTEM_PROMPT},
        "compaction": compaction,
        "limits": NO_LIMITS,
        "tenancy": {"cache_salt_secret": "bench"},
        "logging": {"level": "WARNING"},
    }
    windows = args.window or [6]
    pauses = args.pause if args.pause is not None else [0.0, 1.0]
    try:
        with tempfile.TemporaryDirectory() as workdir:
            results = [
                await run_compaction(
                    engine, fmt, sections, args, Path(workdir) / f"pause-{pause_s:g}", pause_s
                )
                for pause_s in pauses
            ]
        if not args.compaction_only:
            for window in [*windows, None]:
                results.append(await run_plain(engine, fmt, args, window))
    finally:
        await engine.shutdown()

    marks = [m for m in MARKS if m <= args.turns]
    print(
        f"\n{args.conversations} chats x {args.turns} turns, max_model_len {args.max_model_len},"
        f" block {args.block_size}, max_tokens {args.max_tokens}, watermarks "
        f"{args.high}/{args.low}, summary {'off' if args.no_summary else 'on'}, next base "
        f"{'prepared in the background' if not args.no_prepare else 'made in the turn'}, "
        f"rolling windows {windows} messages; compaction "
        + ", ".join(pace_name(pause_s) for pause_s in pauses)
    )
    print(f"{'':<11} turn index               " + " ".join(f"{m:>7d}" for m in marks))
    for result in results:
        print("\n".join(summarise(result, args.block_size, marks)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--high", type=float, default=0.9)
    parser.add_argument("--low", type=float, default=0.5)
    parser.add_argument("--summary-max-tokens", type=int, default=64)
    parser.add_argument("--no-summary", action="store_true")
    parser.add_argument("--no-prepare", action="store_true", help="next base made in the turn")
    parser.add_argument("--prepare", type=float, default=0.0, help="prepare_watermark (halfway)")
    parser.add_argument("--compaction-only", action="store_true", help="no rolling, no no-limit")
    parser.add_argument(
        "--pause", type=float, action="append", help="s before each next message (0 and 1)"
    )
    parser.add_argument("--window", type=int, action="append", help="rolling window (6 messages)")
    parser.add_argument("--model", default="data/demo-model")
    parser.add_argument("--hidden", type=int, default=0, help="build a bigger random model")
    parser.add_argument("--layers", type=int, default=0, help="build a bigger random model")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
