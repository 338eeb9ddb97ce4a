"""The in-process vLLM engine (``AsyncLLM``), fed token ids and streamed back in deltas.

vLLM runs its engine core in a child process started with ``spawn``: any
script that starts this engine needs the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import structlog

from bot.engine.base import EngineTimings, GenerationChunk, GenerationRequest
from bot.engine.cpu_dtype import resolve_dtype
from bot.engine.process_priority import descendants, lower_priority, move_core_onto_worker_cpus
from bot.engine.settings import EngineSettings
from bot.errors import EngineError, ErrorClass

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = structlog.get_logger(__name__)


def _engine_timings(metrics: Any) -> EngineTimings | None:
    """Queue, prefill and decode from vLLM's per-request engine-core timestamps."""
    if metrics is None or not getattr(metrics, "first_token_ts", 0.0):
        return None
    queued = metrics.queued_ts
    scheduled = metrics.scheduled_ts or queued
    first = metrics.first_token_ts
    last = metrics.last_token_ts or first
    return EngineTimings(
        queue_ms=max(0.0, (scheduled - queued) * 1000),
        prefill_ms=max(0.0, (first - scheduled) * 1000),
        decode_ms=max(0.0, (last - first) * 1000),
    )


def _classify(exc: BaseException) -> EngineError:
    if isinstance(exc, EngineError):
        return exc
    name = type(exc).__name__
    text = str(exc)
    if name == "EngineDeadError" or "EngineCore" in text:
        return EngineError(ErrorClass.ENGINE_UNAVAILABLE, f"vLLM engine is not running: {text}")
    if isinstance(exc, MemoryError) or "out of memory" in text.lower():
        return EngineError(ErrorClass.OOM, text)
    if isinstance(exc, ValueError) and ("max_model_len" in text or "too long" in text):
        return EngineError(ErrorClass.CONTEXT_OVERFLOW, text)
    return EngineError(ErrorClass.INTERNAL, f"{name}: {text}")


class LocalVLLMEngine:
    """``InferenceEngine`` backed by ``vllm.v1.engine.async_llm.AsyncLLM`` in this process."""

    def __init__(self, settings: EngineSettings) -> None:
        self._settings = settings
        self.max_model_len = settings.max_model_len
        self._llm: AsyncLLM | None = None
        self.process_ids: frozenset[int] = frozenset()
        """The processes vLLM started for this engine (its engine core and worker)."""

    async def start(self) -> None:
        if self._llm is not None:
            return
        settings = self._settings
        if settings.cpu_kvcache_space_gib:
            # Read by vLLM's CPU worker (a spawned child that inherits the environment).
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kvcache_space_gib))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        dtype = resolve_dtype(settings.dtype, settings.model, on_cpu=current_platform.is_cpu())
        args = AsyncEngineArgs(
            model=settings.model,
            tokenizer=settings.tokenizer,
            dtype=dtype,  # type: ignore[arg-type]
            max_model_len=settings.max_model_len,
            block_size=settings.block_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enforce_eager=settings.enforce_eager,
            seed=settings.seed,
            enable_prefix_caching=True,
            # Requests carry a priority (``GenerationRequest.priority``): users' turns
            # waiting to be scheduled go before background work. With every priority
            # equal it is first come, first served, as vLLM's default.
            scheduling_policy="priority",
        )
        log.info("engine_starting", model=settings.model, kind="local", dtype=dtype)
        started_before = descendants()
        try:
            self._llm = AsyncLLM.from_engine_args(args)
        except Exception as exc:
            raise EngineError(
                ErrorClass.ENGINE_UNAVAILABLE,
                f"vLLM failed to start: {type(exc).__name__}: {exc}",
                hint="check engine.model (a local folder or a model id available offline)",
            ) from exc
        # vLLM reads its settings from the environment at every use, several times for each
        # output of each request in this process's output handler (2 us a read, ~2.5 % of
        # the loop's busy time at 100 messages/s), until the cache is on: what vLLM's own
        # engine process does once it has started. VLLM_* set after this are not seen here.
        from vllm.envs import enable_envs_cache

        enable_envs_cache()
        self.process_ids = frozenset(descendants() - started_before)
        core_cpus: frozenset[int] = frozenset()
        if settings.core_on_worker_cpus:
            core_cpus = move_core_onto_worker_cpus(self.process_ids)
        lowered = 0
        if settings.process_nice:
            lowered = lower_priority(self.process_ids, settings.process_nice)
        log.info(
            "engine_started",
            model=settings.model,
            core_cpus=sorted(core_cpus),
            threads_niced=lowered,
        )

    @property
    def llm(self) -> AsyncLLM:
        if self._llm is None:
            raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "the engine has not been started")
        return self._llm

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        from vllm import SamplingParams
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind

        llm = self.llm
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=list(request.stop) or None,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            output_kind=RequestOutputKind.DELTA,
        )
        # Already-tokenized engine input: vLLM neither renders nor re-tokenizes it.
        prompt = tokens_input(list(request.prompt_token_ids), cache_salt=request.cache_salt or None)
        stream = llm.generate(
            prompt, params, request_id=request.request_id, priority=request.priority
        )
        try:
            async for output in stream:
                completion = output.outputs[0]
                finished = output.finished
                yield GenerationChunk(
                    token_ids=list(completion.token_ids),
                    text=completion.text,
                    finished=finished,
                    finish_reason=completion.finish_reason if finished else None,
                    prompt_tokens=len(request.prompt_token_ids),
                    cached_tokens=output.num_cached_tokens,
                    timings=_engine_timings(output.metrics) if finished else None,
                )
        except Exception as exc:
            raise _classify(exc) from exc
        finally:
            # Closing vLLM's stream early (cancelled turn, client gone) makes it
            # abort the request, which frees its slot and KV blocks at once.
            await stream.aclose()

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    async def check_health(self) -> None:
        try:
            await self.llm.check_health()
        except Exception as exc:
            raise _classify(exc) from exc

    async def shutdown(self) -> None:
        if self._llm is not None:
            llm, self._llm = self._llm, None
            llm.shutdown()
            log.info("engine_stopped")
