"""A pass-through around the real engine that records what it was asked (not a fake)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from bot.engine.base import GenerationChunk, GenerationRequest, InferenceEngine
from tests.engines import PassThroughEngine


@dataclass
class RecordedGeneration:
    request: GenerationRequest
    generated: list[int] = field(default_factory=list)
    final: GenerationChunk | None = None


class RecordingEngine(PassThroughEngine):
    def __init__(self, engine: InferenceEngine) -> None:
        super().__init__(engine)
        self.calls: list[RecordedGeneration] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        record = RecordedGeneration(request)
        self.calls.append(record)
        async for chunk in self._engine.generate(request):
            record.generated.extend(chunk.token_ids)
            if chunk.finished:
                record.final = chunk
            yield chunk
