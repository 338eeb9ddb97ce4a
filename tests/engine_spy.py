"""A pass-through around the real engine that records what it was asked (not a fake)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from bot.engine.base import GenerationChunk, GenerationRequest, InferenceEngine


@dataclass
class RecordedGeneration:
    request: GenerationRequest
    generated: list[int] = field(default_factory=list)
    final: GenerationChunk | None = None


class RecordingEngine:
    def __init__(self, engine: InferenceEngine) -> None:
        self._engine = engine
        self.max_model_len = engine.max_model_len
        self.calls: list[RecordedGeneration] = []

    async def start(self) -> None:
        await self._engine.start()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        record = RecordedGeneration(request)
        self.calls.append(record)
        async for chunk in self._engine.generate(request):
            record.generated.extend(chunk.token_ids)
            if chunk.finished:
                record.final = chunk
            yield chunk

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def shutdown(self) -> None:
        await self._engine.shutdown()
