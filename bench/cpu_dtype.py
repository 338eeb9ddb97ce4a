"""Benchmark: the local engine's decoding speed in the dtype "auto" resolves to, next to
the checkpoint's own dtype (``bot.engine.cpu_dtype``).

On a CPU without native bfloat16 (AVX2 only, say) "auto" runs bfloat16 weights in
float32; elsewhere both lines start the same dtype. For each, the engine starts,
then 1 and 4 requests at once each decode ``--tokens`` tokens from the same
60-token prompt (counted as produced: a reply may end early), and the tokens a
second are printed: what a chat's reply speed and the engine's throughput gain or lose.

Run:  .venv/bin/python bench/cpu_dtype.py --model data/smollm2
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path

from bot.engine.base import GenerationRequest
from bot.engine.cpu_dtype import checkpoint_dtype, resolve_dtype
from bot.engine.settings import EngineSettings
from bot.engine.vllm_local import LocalVLLMEngine

PROMPT = list(range(100, 160))


async def tokens_per_second(engine: LocalVLLMEngine, chats: int, tokens: int) -> float:
    produced = 0

    async def one() -> None:
        nonlocal produced
        request = GenerationRequest(
            request_id=uuid.uuid4().hex,
            prompt_token_ids=PROMPT,
            max_tokens=tokens,
            temperature=0.0,
            top_p=1.0,
        )
        async for chunk in engine.generate(request):
            produced += len(chunk.token_ids)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(chats)))
    return produced / (time.perf_counter() - started)


async def measure(model: str, dtype: str, tokens: int) -> list[float]:
    engine = LocalVLLMEngine(EngineSettings(model=model, dtype=dtype))
    await engine.start()
    try:
        await tokens_per_second(engine, 1, 4)  # warm
        return [await tokens_per_second(engine, chats, tokens) for chats in (1, 4)]
    finally:
        await engine.shutdown()


async def main(args: argparse.Namespace) -> None:
    own = checkpoint_dtype(Path(args.model)) or "auto"
    resolved = resolve_dtype("auto", args.model, on_cpu=True)
    print(f"# {args.model}: checkpoint {own}; 'auto' resolves to {resolved} on this CPU")
    print("dtype                         1 chat tok/s  4 chats tok/s")
    for label, dtype in (
        (f"checkpoint's ({own})", own),
        (f"'auto' as resolved ({resolved})", "auto"),
        # The rule's alternative on every CPU, so a machine the rule leaves in bfloat16 shows
        # what float32 would have given.
        ("float32", "float32"),
    ):
        one, four = await measure(args.model, dtype, args.tokens)
        print(f"{label:<30}  {one:>11.1f}  {four:>13.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="data/smollm2")
    parser.add_argument("--tokens", type=int, default=64)
    asyncio.run(main(parser.parse_args()))
