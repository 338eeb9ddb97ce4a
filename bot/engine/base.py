"""The inference engine boundary: token ids in, streamed token ids and text out.

The turn pipeline talks only to ``InferenceEngine``; the in-process vLLM
engine (``bot.engine.vllm_local``) and remote vLLM servers implement it.
Prompts cross this boundary as token ids, never as text, so that the prefix
the engine sees is exactly the one stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

USER_PRIORITY = 0
BACKGROUND_PRIORITY = 1
"""Work no user waits for (a compacted base's summary and prefills). vLLM's scheduling
priority: lower values are scheduled first."""


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None = None
    stop: tuple[str, ...] = ()
    """Strings that end the reply where they begin (left out of its text)."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    cache_salt: str | None = None
    """Tenant salt: prompts with different salts never share KV blocks."""
    session_key: str | None = None
    """The conversation; remote engines route on it so a chat returns to its KV cache."""
    priority: int = USER_PRIORITY
    """Scheduling priority (``BACKGROUND_PRIORITY`` for work no user waits for)."""


@dataclass(frozen=True)
class EngineTimings:
    """Per-request timings from the engine's own clock, in milliseconds."""

    queue_ms: float
    prefill_ms: float
    decode_ms: float


@dataclass(frozen=True)
class GenerationChunk:
    """One streamed step: the ids and text generated since the previous chunk."""

    token_ids: Sequence[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    """Prompt tokens whose KV came from the prefix cache (set at least on the final chunk)."""
    timings: EngineTimings | None = None
    """Set on the final chunk."""


class InferenceEngine(Protocol):
    max_model_len: int

    async def start(self) -> None:
        """Load the model / connect; returns when requests can be served."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream the generation; closing the iterator early aborts the request.

        Raises ``bot.errors.EngineError`` with its error class on failure.
        """
        ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> None:
        """Raise ``EngineError`` when the engine cannot serve."""

    async def shutdown(self) -> None: ...
