"""The real engine, slowed down to ``delay_s`` a token (turns stay in flight).

The delay is per token, not per chunk: vLLM merges the deltas a slow reader
has not taken yet, so a per-chunk delay would let a whole reply arrive in two
chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from bot.engine.base import GenerationChunk, GenerationRequest


class SlowEngine:
    def __init__(self, engine: Any, *, delay_s: float) -> None:
        self._engine = engine
        self.delay_s = delay_s
        self.max_model_len = engine.max_model_len

    async def start(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        async for chunk in self._engine.generate(request):
            await asyncio.sleep(self.delay_s * max(1, len(chunk.token_ids)))
            yield chunk

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def shutdown(self) -> None: ...
