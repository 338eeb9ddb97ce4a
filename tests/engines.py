"""Engines for tests: the real engine slowed down or waiting for company, and one that is down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

from bot.engine.base import GenerationChunk, GenerationRequest, InferenceEngine
from bot.errors import EngineError, ErrorClass


class PassThroughEngine:
    """The real engine, unchanged; the engines below change only ``generate``."""

    def __init__(self, engine: InferenceEngine) -> None:
        self._engine = engine
        self.max_model_len = engine.max_model_len

    async def start(self) -> None:
        await self._engine.start()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        async for chunk in self._engine.generate(request):
            yield chunk

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def shutdown(self) -> None:
        await self._engine.shutdown()


class SlowEngine(PassThroughEngine):
    """The real engine, with a pause before each streamed step.

    The tiny model answers in about 0.1 s, too fast to watch a reply grow or to
    stop one half-way; the pause makes streaming observable, nothing else changes.
    """

    def __init__(self, engine: InferenceEngine, pause_s: float) -> None:
        super().__init__(engine)
        self.pause_s = pause_s
        """Read at every step: a test may slow down only the turn it wants to interrupt."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        async for chunk in self._engine.generate(request):
            await asyncio.sleep(self.pause_s)
            if self.pause_s and len(chunk.text) > 1:
                # On a busy machine vLLM merges the steps a slow reader has not taken yet,
                # down to one chunk: split each text so a reader always sees it grow.
                half = len(chunk.text) // 2
                yield replace(
                    chunk, text=chunk.text[:half], finished=False, finish_reason=None, timings=None
                )
                await asyncio.sleep(self.pause_s)
                chunk = replace(chunk, token_ids=[], text=chunk.text[half:])
            yield chunk


class DownEngine:
    """An engine that is not there: every request fails as ``engine_unavailable``."""

    max_model_len = 1024

    async def start(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "connection refused (test)")
        yield  # pragma: no cover - makes this an async generator

    async def abort(self, request_id: str) -> None:
        return None

    async def check_health(self) -> None:
        raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "connection refused (test)")

    async def shutdown(self) -> None:
        return None


class MeetingEngine(PassThroughEngine):
    """The real engine, where a request starts generating only once ``parties`` are waiting.

    A service that ran conversations one at a time would never gather them all:
    its first request times out and fails.
    """

    def __init__(self, engine: InferenceEngine, parties: int) -> None:
        super().__init__(engine)
        self._barrier = asyncio.Barrier(parties)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        async with asyncio.timeout(30):
            await self._barrier.wait()
        async for chunk in self._engine.generate(request):
            yield chunk


class TrickleEngine(PassThroughEngine):
    """The real engine's reply, handed on a few characters at a time with a pause between.

    For tests that need a reply to keep growing for seconds, whatever vLLM merges.
    """

    def __init__(self, engine: InferenceEngine, piece_chars: int, pause_s: float) -> None:
        super().__init__(engine)
        self.piece_chars = piece_chars
        self.pause_s = pause_s

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        async for chunk in self._engine.generate(request):
            text = chunk.text
            pieces = [text[i : i + self.piece_chars] for i in range(0, len(text), self.piece_chars)]
            for index, piece in enumerate(pieces[:-1]):
                await asyncio.sleep(self.pause_s)
                ids = chunk.token_ids if index == 0 else []
                yield replace(
                    chunk,
                    text=piece,
                    token_ids=ids,
                    finished=False,
                    finish_reason=None,
                    timings=None,
                )
            await asyncio.sleep(self.pause_s)
            last = pieces[-1] if pieces else ""
            yield replace(chunk, text=last, token_ids=chunk.token_ids if len(pieces) <= 1 else [])


class NulByteEngine(PassThroughEngine):
    """The real engine, whose first piece of text decodes to a U+0000 as well.

    The demo model's byte-level tokens decode to U+0000 now and then (so can any
    model's); this makes every reply do so, where a test needs it.
    """

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        marked = False
        async for chunk in self._engine.generate(request):
            if chunk.text and not marked:
                marked = True
                chunk = replace(chunk, text=chunk.text[:1] + "\x00" + chunk.text[1:])
            yield chunk


class GatedEngine(PassThroughEngine):
    """The real engine, where every request waits until the test opens the gate.

    Keeps a conversation's first turn running, and so the turns behind it queued,
    for as long as a test needs.
    """

    def __init__(self, engine: InferenceEngine) -> None:
        super().__init__(engine)
        self.gate = asyncio.Event()
        self.waiting = 0

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        async for chunk in self._engine.generate(request):
            yield chunk
