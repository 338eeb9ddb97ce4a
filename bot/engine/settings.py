"""Settings of the inference engine: the ``[engine]`` section (mounted by ``bot.config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

DEFAULT_DATA_DIR = Path("data")
DEFAULT_DEMO_MODEL_DIR = DEFAULT_DATA_DIR / "demo-model"
DEFAULT_ENGINE_MAX_CONNECTIONS = 1024


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineSettings(_Section):
    kind: Literal["local", "openai"] = "local"
    model: str = str(DEFAULT_DEMO_MODEL_DIR)
    """Hugging Face model id or local folder (the default is built by ``botctl demo-model``)."""
    tokenizer: str | None = None
    dtype: str = "auto"
    """vLLM's dtype; "auto" is the checkpoint's, except float32 for bfloat16 weights on a
    CPU that would emulate bfloat16 (``bot.engine.cpu_dtype``)."""
    max_model_len: int = Field(2048, gt=0)
    block_size: int = Field(32, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    enforce_eager: bool = True
    seed: int = 0
    cpu_kvcache_space_gib: int = Field(1, ge=0)
    """vLLM's ``VLLM_CPU_KVCACHE_SPACE`` on CPU builds; 0 lets vLLM choose."""
    core_on_worker_cpus: bool = True
    """Run the local engine's core on the CPUs vLLM bound its worker to, so that the CPU
    vLLM keeps spare is the service's: acks stay short while the engine is busy, and a
    lone chat decodes slower (``bot.engine.process_priority``). Nothing changes where the
    worker is not bound (GPU builds)."""
    process_nice: int = Field(0, ge=0, le=19)
    """The nice value of the local engine's own processes (vLLM's engine core and worker).
    Above the service's (e.g. 10), acks stay short while the engine is busy, and replies
    come slower (``bot.engine.process_priority``). 0 leaves them as they start."""
    # Remote engines (kind = "openai").
    base_urls: list[str] = Field(default_factory=list)
    api_key: SecretStr | None = None
    served_model_name: str | None = None
    request_timeout_s: float = Field(120.0, gt=0)
    """Longest silence tolerated from a remote server (before and between streamed chunks)."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """Longest TCP connect to a replica; waiting for a free pooled connection is not counted."""
    max_connections: int = Field(DEFAULT_ENGINE_MAX_CONNECTIONS, gt=0)
    """Connections to the replicas a worker may hold: one per turn generating. A turn over
    it waits for one (queued, not failed); vLLM queues what it cannot batch anyway."""
    session_header: str = "x-session-id"
    """Carries the conversation id, so a vLLM router in front keeps the same affinity."""
    max_attempts: int = Field(3, ge=1)
    """Tries per turn across replicas, counted only while nothing has been streamed."""
    retry_backoff_s: float = Field(0.2, ge=0)
    """Base of the jittered exponential backoff between tries."""
    breaker_failures: int = Field(3, ge=1)
    """Failures in a row that open a replica's circuit breaker."""
    breaker_cooldown_s: float = Field(10.0, gt=0)

    @field_validator("block_size")
    @classmethod
    def _block_size_multiple_of_16(cls, value: int) -> int:
        if value % 16:
            raise ValueError("must be a multiple of 16 (32 on CPU)")
        return value
