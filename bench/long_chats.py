"""Benchmark: long chats under three context policies, side by side on the same conversations.

* ``compaction`` - this service (real app, SQLite, real runner): token-exact history,
  rebuilt once when prompt + max_tokens passes the high watermark;
* ``rolling-k``  - the last k messages re-rendered with the chat template every turn
  (how many bots keep long chats in context);
* ``no-limit``   - token-exact full history, never trimmed: fails once the window is full.

All three run on one in-process vLLM engine, each with its own cache_salt so they
never share KV blocks. Per policy it prints
  * the share of cacheable prompt tokens served from the prefix cache (turns 2..T),
    where "cacheable" is the full blocks of the previous prompt + reply, capped by
    the full blocks of the current prompt;
  * prompt tokens recomputed (prompt - cached) per turn, by turn index;
  * TTFT by turn index: the engine's queue + prefill of the turn's request;
  * turns that failed (context overflow) and compactions;
  * for compaction, once per pace (``--pause``: back to back, and with pauses between a
    reply and the next message): the switching turns next to the other turns (TTFT from
    message received to first token as the service measured it, p50 / p90 / max; the
    engine's queue + prefill; the ``compact`` layer; prompt tokens not from cache), the
    turns due to switch that went on uncompacted because the next base was not ready yet,
    the cache share of the requests on the turns' way (the turns', and summaries made
    inside them), and the requests made off the turns (prepared bases, prefills).
    ``--no-prepare`` makes every next base inside its switching turn instead.

Run:  .venv/bin/python bench/long_chats.py --conversations 4 --turns 60
      .venv/bin/python bench/long_chats.py --conversations 2 --turns 120 --max-tokens 48 \
          --compaction-only [--pause 0] [--pause 1] [--no-prepare]
      .venv/bin/python bench/long_chats.py --hidden 512 --layers 8   # prefill shows in TTFT
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import select

from bot.apikeys import create_key
from bot.app import create_app
from bot.config import EngineSettings, load_settings
from bot.engine.base import GenerationChunk, GenerationRequest, InferenceEngine
from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from bot.models.demo_model import build_demo_model
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.migrate import upgrade
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


@dataclass
class TurnRecord:
    prompt: int
    cached: int
    generated: int
    ttft_ms: float
    failed: bool = False
    compact_ms: float = 0.0
    compact_call: CompactCall | None = None
    service_ttft_ms: float = float("nan")
    """First token - message received, as the service measured it (``turns.layer_ms``)."""
    summary_prompt: int = 0
    """Prompt of a summary request made inside the turn (on its critical path)."""
    summary_cached: int = 0
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    layers: dict[str, float] = field(default_factory=dict)
    switched: bool = False
    """The turn switched to a new base (it has a compaction)."""
    postponed: bool = False
    """Due to switch, it went on uncompacted: its prompt fit and the next base was not ready."""


@dataclass
class PolicyResult:
    name: str
    chats: list[list[TurnRecord]] = field(default_factory=list)
    compactions: int = 0
    background: list[tuple[int, int]] = field(default_factory=list)
    """(prompt, cached) of requests made off the turns (base preparation and its prefills)."""


class Recorder:
    """Pass-through engine that keeps each request's final chunk (prompt size, cache, timings)."""

    def __init__(self, engine: InferenceEngine) -> None:
        self._engine = engine
        self.max_model_len = engine.max_model_len
        self.finals: dict[str, tuple[int, GenerationChunk]] = {}

    async def start(self) -> None:
        await self._engine.start()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        async for chunk in self._engine.generate(request):
            if chunk.finished:
                self.finals[request.request_id] = (len(request.prompt_token_ids), chunk)
            yield chunk

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def shutdown(self) -> None:
        await self._engine.shutdown()


@dataclass(frozen=True)
class CompactCall:
    """Where one turn's ``compact`` layer went."""

    wall_ms: float
    cpu_ms: float
    """On this thread's CPU: the work itself."""
    gc_ms: float
    """In Python's garbage collector (part of the CPU time)."""
    preempted: int
    """Times the kernel took the CPU away from the thread (another process ran)."""
    blocked: int
    """Times the thread gave the CPU up (waiting for the GIL or I/O)."""


class CompactProbe:
    """Times every ``Compactor.compact`` call of an app by wall clock, thread CPU time, GC
    pauses and context switches: a slow switch is either work or a thread kept waiting."""

    def __init__(self, app: Any) -> None:
        # The runner's compactor; the bench reaches into the app to time just this call.
        compactor = app[TURNS]._runner.policy.compactor
        self.calls: dict[str, CompactCall] = {}
        self._gc_ms = 0.0
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        original = compactor.compact

        async def compact(**kwargs: Any) -> Any:
            wall, cpu, gc_before = time.perf_counter(), time.thread_time(), self._gc_ms
            usage = resource.getrusage(resource.RUSAGE_THREAD)
            try:
                return await original(**kwargs)
            finally:
                after = resource.getrusage(resource.RUSAGE_THREAD)
                self.calls[kwargs["turn_id"]] = CompactCall(
                    (time.perf_counter() - wall) * 1000,
                    (time.thread_time() - cpu) * 1000,
                    self._gc_ms - gc_before,
                    after.ru_nivcsw - usage.ru_nivcsw,
                    after.ru_nvcsw - usage.ru_nvcsw,
                )

        compactor.compact = compact

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_ms += (time.perf_counter() - self._gc_started) * 1000

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)


def user_line(chat: int, turn: int) -> str:
    return f"[{chat}.{turn}] {USER_LINES[(chat * 3 + turn) % len(USER_LINES)]}"


def ttft_ms(chunk: GenerationChunk) -> float:
    timings = chunk.timings
    return timings.queue_ms + timings.prefill_ms if timings else float("nan")


async def generate(
    engine: LocalVLLMEngine, prompt: list[int], salt: str, max_tokens: int
) -> tuple[list[int], str, GenerationChunk]:
    request = GenerationRequest(
        request_id=uuid.uuid4().hex,
        prompt_token_ids=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        top_p=1.0,
        cache_salt=salt,
    )
    ids: list[int] = []
    text = ""
    final: GenerationChunk | None = None
    async for chunk in engine.generate(request):
        ids.extend(chunk.token_ids)
        text += chunk.text
        if chunk.finished:
            final = chunk
    assert final is not None
    return ids, text, final


async def run_no_limit(
    engine: LocalVLLMEngine, fmt: ChatFormat, chats: int, turns: int, max_tokens: int
) -> PolicyResult:
    result = PolicyResult("no-limit")
    for chat in range(chats):
        records: list[TurnRecord] = []
        history: list[int] = []
        generated: list[int] = []
        for turn in range(turns):
            content = user_line(chat, turn)
            user = fmt.next_turn(generated, content) if history else fmt.first_turn(content)
            prompt = history + user.token_ids
            if len(prompt) + max_tokens > engine.max_model_len:
                records.append(TurnRecord(len(prompt), 0, 0, float("nan"), failed=True))
                continue  # what the service did before compaction: context_overflow, every turn
            generated, _, final = await generate(engine, prompt, f"nolimit-{chat}", max_tokens)
            history = prompt + generated
            records.append(
                TurnRecord(len(prompt), final.cached_tokens or 0, len(generated), ttft_ms(final))
            )
        result.chats.append(records)
    return result


async def run_rolling(
    engine: LocalVLLMEngine, fmt: ChatFormat, chats: int, turns: int, max_tokens: int, k: int
) -> PolicyResult:
    result = PolicyResult(f"rolling-{k}")
    for chat in range(chats):
        records: list[TurnRecord] = []
        messages: list[dict[str, str]] = []
        for turn in range(turns):
            messages.append({"role": "user", "content": user_line(chat, turn)})
            window = [{"role": "system", "content": SYSTEM_PROMPT}, *messages[-k:]]
            prompt = fmt.render_ids(window, add_generation_prompt=True)
            generated, text, final = await generate(
                engine, prompt, f"rolling{k}-{chat}", max_tokens
            )
            messages.append({"role": "assistant", "content": text})
            records.append(
                TurnRecord(len(prompt), final.cached_tokens or 0, len(generated), ttft_ms(final))
            )
        result.chats.append(records)
    return result


def pace_name(pause_s: float) -> str:
    return "back to back" if not pause_s else f"{pause_s:g} s pauses"


async def run_compaction(
    engine: LocalVLLMEngine,
    fmt: ChatFormat,
    settings_overrides: dict[str, Any],
    chats: int,
    turns: int,
    workdir: Path,
    pause_s: float,
) -> PolicyResult:
    """This service's turns, one conversation after the other; ``pause_s`` between a reply's
    end and the next message (0: back to back, as a client replaying a history sends them)."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    url = f"sqlite+aiosqlite:///{workdir / 'bench.db'}"
    await asyncio.to_thread(upgrade, url)
    settings = load_settings(None, database={"url": url}, **settings_overrides)
    db = create_engine(url)
    sessions = create_sessionmaker(db)
    async with sessions() as session, session.begin():
        # An owner per pace: its own cache salt, so no run finds another's blocks.
        owner = f"bench-compaction-{pause_s:g}"
        key = (await create_key(session, name="bench", owner=owner)).key
    recorder = Recorder(engine)
    app = await create_app(settings, engine=recorder, chat_format=fmt)
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    probe = CompactProbe(app)  # the app's turn runner exists once it has started
    result = PolicyResult(f"compaction, {pace_name(pause_s)}")
    try:
        for chat in range(chats):
            for turn in range(turns):
                response = await client.post(
                    "/v1/messages",
                    json={
                        "conversation_id": f"chat-{chat}",
                        "message_id": f"m{turn}",
                        "text": user_line(chat, turn),
                    },
                    headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"},
                )
                await response.read()
                if pause_s:
                    await asyncio.sleep(pause_s)
        async with sessions() as session:
            rows = list((await session.scalars(select(Turn).order_by(Turn.created_at))).all())
        by_chat: dict[str, list[Turn]] = {}
        for row in rows:
            by_chat.setdefault(row.conversation_id, []).append(row)
        for chat_rows in by_chat.values():
            records = []
            for row in sorted(chat_rows, key=lambda r: r.seq):
                final = recorder.finals.get(row.id)
                if row.status != "done" or final is None:
                    records.append(TurnRecord(row.prompt_tokens or 0, 0, 0, float("nan"), True))
                    continue
                prompt, chunk = final
                summary = recorder.finals.get(f"{row.id}:summary")
                compact_ms = float((row.layer_ms or {}).get("compact", 0.0))
                records.append(
                    TurnRecord(
                        prompt,
                        chunk.cached_tokens or 0,
                        row.completion_tokens or 0,
                        ttft_ms(chunk),
                        compact_ms=compact_ms,
                        compact_call=probe.calls.get(row.id),
                        service_ttft_ms=float((row.layer_ms or {}).get("ttft") or "nan"),
                        summary_prompt=summary[0] if summary else 0,
                        summary_cached=(summary[1].cached_tokens or 0) if summary else 0,
                        queue_ms=chunk.timings.queue_ms if chunk.timings else 0.0,
                        prefill_ms=chunk.timings.prefill_ms if chunk.timings else 0.0,
                        layers={
                            k: float(v)
                            for k, v in (row.layer_ms or {}).items()
                            if isinstance(v, int | float)
                        },
                        switched=row.compaction_id is not None,
                        postponed=row.compaction_id is None and compact_ms > 0,
                    )
                )
                result.compactions += 1 if row.compaction_id else 0
            result.chats.append(records)
        result.background = [
            (prompt, chunk.cached_tokens or 0)
            for request_id, (prompt, chunk) in recorder.finals.items()
            if request_id.startswith("prepare-")
        ]
    finally:
        probe.close()
        await client.close()
        await db.dispose()
    return result


def cacheable(previous: TurnRecord, current: TurnRecord, block: int) -> int:
    before = (previous.prompt + previous.generated - 1) // block * block
    return min(before, (current.prompt - 1) // block * block)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def critical_path(result: PolicyResult, block: int) -> list[str]:
    """What the user waits for: switching turns next to the others, and the cache share of the
    requests on the turns' way (the turns', and summaries made inside them).

    A summary request inside a turn counts with all of its whole blocks as cacheable (nothing
    before it shares its prefix, which is the point: that work belongs off the turn).
    """
    cached = possible = 0
    for records in result.chats:
        for index, record in enumerate(records):
            if record.failed or index == 0 or records[index - 1].failed:
                continue
            can = cacheable(records[index - 1], record, block)
            cached += min(record.cached, can)
            possible += can
            if record.summary_prompt:
                possible += (record.summary_prompt - 1) // block * block
                cached += record.summary_cached
    share = 100 * cached / possible if possible else float("nan")
    in_turn = sum(1 for records in result.chats for r in records if r.summary_prompt)
    pad = f"{'':<11}"
    lines = [
        f"{pad} critical path: cacheable {possible} tokens, from cache {cached} "
        f"({share:.1f} %); switching turns that waited for their summary: {in_turn}",
        f"{pad} {'turns (after the first)':<28} {'count':>5}  TTFT ms p50 / p90 / max"
        f"     engine queue+prefill p50   compact ms p50 / max   uncached p50",
    ]
    groups: dict[str, Callable[[TurnRecord], bool]] = {
        "switching": lambda r: r.switched,
        "due, went on uncompacted": lambda r: r.postponed,
        "other turns": lambda r: not r.switched and not r.postponed,
    }
    medians: dict[str, float] = {}
    for label, chosen in groups.items():
        picked = [r for records in result.chats for r in records[1:] if chosen(r) and not r.failed]
        if not picked:
            lines.append(f"{pad} {label:<28} {0:>5}")
            continue
        ttft = [r.service_ttft_ms for r in picked]
        compact = [r.compact_ms for r in picked]
        medians[label] = statistics.median(ttft)
        lines.append(
            f"{pad} {label:<28} {len(picked):>5}  {statistics.median(ttft):7.1f} / "
            f"{_quantile(ttft, 0.9):6.1f} / {max(ttft):6.1f}     "
            f"{statistics.median(r.ttft_ms for r in picked):7.1f} ms{'':<16}"
            f"{statistics.median(compact):6.2f} / {max(compact):7.2f}"
            f"   {statistics.median(r.prompt - r.cached for r in picked):8.0f}"
        )
    switching = [r for records in result.chats for r in records if r.switched]
    if switching and "other turns" in medians:
        over = sum(1 for r in switching if r.compact_ms > 10.0)
        lines.append(
            f"{pad} switching turns' TTFT p50 / other turns': "
            f"{medians['switching'] / medians['other turns']:.2f}x; switching turns over "
            f"10 ms in compact: {over} of {len(switching)}"
        )
    slow = [r.compact_call for r in switching if r.compact_call and r.compact_ms > 10.0]
    if slow:
        lines.append(
            f"{pad} switching turns over 10 ms in compact: wall "
            + ", ".join(f"{c.wall_ms:.1f}" for c in slow)
            + " ms; of it on the thread's CPU "
            + ", ".join(f"{c.cpu_ms:.1f}" for c in slow)
            + " ms (in GC "
            + ", ".join(f"{c.gc_ms:.1f}" for c in slow)
            + "); CPU taken away by the kernel "
            + ", ".join(str(c.preempted) for c in slow)
            + " times, given up (GIL, I/O) "
            + ", ".join(str(c.blocked) for c in slow)
            + " times"
        )
    calls = [r.compact_call for r in switching if r.compact_call]
    if calls:
        lines.append(
            f"{pad} all switching turns' compact: on CPU p50 "
            f"{statistics.median(c.cpu_ms for c in calls):.2f} ms, max "
            f"{max(c.cpu_ms for c in calls):.2f} ms"
        )
    for label in ("switching", "other turns"):
        picked = [
            r for records in result.chats for r in records[1:] if groups[label](r) and not r.failed
        ]
        if picked:
            lines.append(
                f"{pad} {label}, sub-millisecond layers' max ms: "
                + ", ".join(
                    f"{name} {max(r.layers.get(name, 0.0) for r in picked):.1f}"
                    for name in ("history", "tokenize", "compact")
                )
            )
    names = ("wait", "history", "tokenize", "compact", "queue", "prefill", "deliver", "ttft")
    for label in ("switching", "other turns"):
        picked = [
            r for records in result.chats for r in records[1:] if groups[label](r) and not r.failed
        ]
        if picked:
            lines.append(
                f"{pad} {label}, service layers p50 ms: "
                + ", ".join(
                    f"{name} {statistics.median(r.layers.get(name, 0.0) for r in picked):.1f}"
                    for name in names
                )
            )
    if result.background:
        lines.append(
            f"{pad} off the turns: {len(result.background)} requests (base summaries and "
            f"prefills), {sum(p for p, _ in result.background)} prompt tokens, "
            f"{sum(c for _, c in result.background)} from cache"
        )
    return lines


def summarise(result: PolicyResult, block: int, marks: Sequence[int]) -> list[str]:
    cached = possible = recomputed = prompts = 0
    served = 0
    failed = 0
    for records in result.chats:
        for index, record in enumerate(records):
            if record.failed:
                failed += 1
                continue
            served += 1
            prompts += record.prompt
            recomputed += record.prompt - record.cached
            if index == 0 or records[index - 1].failed:
                continue
            cached += min(record.cached, cacheable(records[index - 1], record, block))
            possible += cacheable(records[index - 1], record, block)
    share = 100 * cached / possible if possible else float("nan")
    lines = [
        f"{result.name:<11} cache share {share:6.1f} %   recomputed {recomputed:7d} tokens "
        f"({recomputed / max(served, 1):6.1f}/turn)   prompt {prompts / max(served, 1):5.0f}/turn"
        f"   failed turns {failed:4d}"
        + (f"   compactions {result.compactions}" if result.name.startswith("compaction") else "")
    ]
    cells_recomputed = []
    cells_ttft = []
    for mark in marks:
        at = [r[mark - 1] for r in result.chats if len(r) >= mark and not r[mark - 1].failed]
        if not at:
            cells_recomputed.append(f"{'fail':>7}")
            cells_ttft.append(f"{'fail':>7}")
            continue
        cells_recomputed.append(f"{statistics.mean(r.prompt - r.cached for r in at):7.0f}")
        cells_ttft.append(f"{statistics.median(r.ttft_ms for r in at):7.1f}")
    lines.append(f"{'':<11} recomputed/turn at turn  " + " ".join(cells_recomputed))
    lines.append(f"{'':<11} TTFT p50 ms at turn      " + " ".join(cells_ttft))
    if result.name.startswith("compaction"):
        lines.extend(critical_path(result, block))
    return lines


async def main_async(args: argparse.Namespace) -> None:
    model_dir = Path(args.model)
    if args.hidden or args.layers:
        # A bigger random model, so that prefill (what the cache saves) shows in TTFT; the
        # builder reads its sizes from module constants.
        from bot.models import demo_model

        demo_model.DEMO_HIDDEN_SIZE = args.hidden or demo_model.DEMO_HIDDEN_SIZE
        demo_model.DEMO_LAYERS = args.layers or demo_model.DEMO_LAYERS
        demo_model.DEMO_HEADS = max(2, demo_model.DEMO_HIDDEN_SIZE // 64)
        model_dir = Path(
            f"data/bench-model-h{demo_model.DEMO_HIDDEN_SIZE}-l{demo_model.DEMO_LAYERS}"
        )
    model_dir = build_demo_model(model_dir)
    engine_settings = EngineSettings(
        model=str(model_dir),
        dtype="float32",
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        enforce_eager=True,
        cpu_kvcache_space_gib=2,
    )
    engine = LocalVLLMEngine(engine_settings)
    await engine.start()
    fmt = ChatFormat(load_tokenizer(str(model_dir)), SYSTEM_PROMPT)
    overrides: dict[str, Any] = {
        "engine": engine_settings.model_dump(mode="json"),
        "generation": {"max_tokens": args.max_tokens, "temperature": 0.0, "top_p": 1.0},
        "chat": {"system_prompt": SYSTEM_PROMPT},
        "compaction": {
            "high_watermark": args.high,
            "low_watermark": args.low,
            "summary": not args.no_summary,
            "summary_max_tokens": args.summary_max_tokens,
            "prepare_ahead": not args.no_prepare,
            **({"prepare_watermark": args.prepare} if args.prepare else {}),
        },
        "limits": {"messages_per_minute": 0, "tokens_per_day": 0},
        "tenancy": {"cache_salt_secret": "bench"},
        "logging": {"level": "WARNING"},
    }
    windows = args.window or [6]
    pauses = args.pause if args.pause is not None else [0.0, 1.0]
    try:
        with tempfile.TemporaryDirectory() as workdir:
            results = [
                await run_compaction(
                    engine,
                    fmt,
                    overrides,
                    args.conversations,
                    args.turns,
                    Path(workdir) / f"pause-{pause_s:g}",
                    pause_s,
                )
                for pause_s in pauses
            ]
            if not args.compaction_only:
                for window in windows:
                    results.append(
                        await run_rolling(
                            engine, fmt, args.conversations, args.turns, args.max_tokens, window
                        )
                    )
                results.append(
                    await run_no_limit(engine, fmt, args.conversations, args.turns, args.max_tokens)
                )
    finally:
        await engine.shutdown()

    marks = [m for m in (1, 2, 5, 10, 15, 20, 30, 40, 50, 60, 80, 100) if m <= args.turns]
    print()
    print(
        f"{args.conversations} chats x {args.turns} turns, max_model_len {args.max_model_len}, "
        f"block {args.block_size}, max_tokens {args.max_tokens}, watermarks "
        f"{args.high}/{args.low}, summary {'off' if args.no_summary else 'on'}, next base "
        f"{'prepared in the background' if not args.no_prepare else 'made in the turn'}, "
        f"rolling windows {windows} messages; compaction "
        + ", ".join(pace_name(pause_s) for pause_s in pauses)
    )
    print(f"{'':<11} turn index               " + " ".join(f"{m:>7d}" for m in marks))
    for result in results:
        for line in summarise(result, args.block_size, marks):
            print(line)


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
    parser.add_argument(
        "--no-prepare",
        action="store_true",
        help="the old behaviour: the next base is made (summary, prefill) inside the turn",
    )
    parser.add_argument(
        "--prepare", type=float, default=0.0, help="compaction.prepare_watermark (default: halfway)"
    )
    parser.add_argument(
        "--compaction-only", action="store_true", help="skip the rolling and no-limit policies"
    )
    parser.add_argument(
        "--pause",
        type=float,
        action="append",
        help="seconds between a reply and the next message, one compaction run each "
        "(repeatable; default 0 and 1: back to back, then with pauses)",
    )
    parser.add_argument(
        "--window", type=int, action="append", help="rolling window in messages (repeatable; 6)"
    )
    parser.add_argument("--model", default="data/demo-model")
    parser.add_argument("--hidden", type=int, default=0, help="build a bigger random model")
    parser.add_argument("--layers", type=int, default=0, help="build a bigger random model")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
