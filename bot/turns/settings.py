"""Settings of the turn pipeline: generation, workers, long conversations, fair use, tenancy.

Mounted in ``bot.config.Settings`` as the ``[generation]``, ``[workers]``,
``[compaction]``, ``[limits]`` and ``[tenancy]`` sections
(``chat.pending_messages`` lives in ``[chat]``). The turn package owns them:
it imports nothing from ``bot.config``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

# Greedy decoding: small chat models (SmolLM2-135M, the `make run` default) wander off at
# any temperature (at 0.3 it lists Paris districts until max_tokens). A repetition
# penalty is no cure: vLLM applies it to the prompt too, and at 1.1 the model no longer
# repeats a name it was told ("Zoltan" came back as "Zlatin").
DEFAULT_TEMPERATURE = 0.0
DEFAULT_TOP_P = 1.0
# A regeneration asks for another reply; greedy decoding would give the same one again.
DEFAULT_REGENERATE_TEMPERATURE = 0.7
DEFAULT_HIGH_WATERMARK = 0.9
DEFAULT_LOW_WATERMARK = 0.5
DEFAULT_SUMMARY_MAX_TOKENS = 128
DEFAULT_THINK_OPEN_TAG = "<think>"
DEFAULT_THINK_CLOSE_TAG = "</think>"
DEFAULT_MESSAGES_PER_MINUTE = 30
DEFAULT_TOKENS_PER_DAY = 1_000_000

PendingMessages = Literal["coalesce", "one_by_one"]
ReasoningAtCompaction = Literal["auto", "keep", "drop"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkerSettings(_Section):
    """Several ``botctl serve`` processes on one PostgreSQL share the turns (docs/scaling.md)."""

    run_turns: bool = True
    """False: an ingress-only process (PostgreSQL only). It verifies, stores and acknowledges
    messages and never runs a turn: it starts no engine, and the processes with
    ``run_turns = true`` on the same database are woken for each turn it accepts
    (``bot.turns.wakeups``). Its acks then wait for no turn's work (docs/scaling.md)."""
    id: str | None = None
    """This process's name in turn leases; default host:pid:random. A fixed id lets a
    restarted worker take its own interrupted turns back at once instead of after the lease."""
    lease_s: float = Field(30.0, gt=0)
    """A running turn's lease; renewed every lease_s / 3; another worker takes over after it."""
    poll_interval_s: float = Field(1.0, gt=0)
    """How often a worker looks for turns accepted elsewhere or left by a dead worker."""
    watchdog_grace_s: float = Field(10.0, gt=0)
    """A turn ``running`` in this process with no live generation for this long is failed
    (``internal``) by the watchdog; only a final write the database refused for good leaves one."""


class GenerationSettings(_Section):
    max_tokens: int = Field(128, gt=0)
    temperature: float = Field(DEFAULT_TEMPERATURE, ge=0)
    """0 is greedy: deterministic, and what small models answer best with."""
    top_p: float = Field(DEFAULT_TOP_P, gt=0, le=1)
    regenerate_temperature: float | None = Field(DEFAULT_REGENERATE_TEMPERATURE, ge=0)
    """The temperature of a regenerated reply where the turn's would be 0 (greedy gives the
    same reply again); 0 or unset: regenerations are greedy too. First answers keep
    ``temperature``."""


class CompactionSettings(_Section):
    enabled: bool = True
    high_watermark: float = Field(DEFAULT_HIGH_WATERMARK, gt=0, le=1)
    """Compact when the next prompt + generation.max_tokens passes this share of max_model_len."""
    low_watermark: float = Field(DEFAULT_LOW_WATERMARK, gt=0, lt=1)
    """The rebuilt prompt + generation.max_tokens stays under this share of max_model_len."""
    prepare_ahead: bool = True
    """Prepare the next base in the background (summary, rendering, a prefill that puts it in
    the engine's prefix cache) once the prompt passes ``prepare_watermark``, so that the turn
    that switches to it finds it cached (``bot.turns.preparation``)."""
    prepare_watermark: float | None = Field(None, gt=0, lt=1)
    """Share of max_model_len (next prompt + generation.max_tokens) from which the next base is
    prepared; between low_watermark and high_watermark. Unset: halfway (0.7 with the defaults).
    The prepared base leaves room for the exchanges until the switch, so the base the switch
    writes is as large as one made in the turn; a lower mark starts earlier (more time for the
    summary) and re-prefills the new exchange after each turn until the switch."""
    summary: bool = True
    """Let the model summarise the dropped turns (one extra generation per compaction)."""
    summary_max_tokens: int = Field(DEFAULT_SUMMARY_MAX_TOKENS, gt=0)
    reasoning: ReasoningAtCompaction = "auto"
    """What happens to generated reasoning (``<think>...</think>``) when the base is rebuilt:
    ``auto`` drops it when the tokenizer or chat template knows the close tag, ``drop`` always
    cuts up to the close tag, ``keep`` re-renders it. Between compactions it is always kept."""
    think_open_tag: str = DEFAULT_THINK_OPEN_TAG
    think_close_tag: str = DEFAULT_THINK_CLOSE_TAG

    @model_validator(mode="after")
    def _low_below_high(self) -> CompactionSettings:
        if self.low_watermark >= self.high_watermark:
            raise ValueError("low_watermark must be below high_watermark")
        if self.prepare_watermark is not None and not (
            self.low_watermark < self.prepare_watermark < self.high_watermark
        ):
            raise ValueError("prepare_watermark must be between low_watermark and high_watermark")
        return self

    @property
    def prepare_at(self) -> float:
        """The share of max_model_len from which the next base is prepared."""
        if self.prepare_watermark is not None:
            return self.prepare_watermark
        return (self.high_watermark + self.low_watermark) / 2


class LimitSettings(_Section):
    """Defaults for every API key and platform user; ``botctl limits set`` overrides per subject.

    0 means no limit.
    """

    messages_per_minute: int = Field(DEFAULT_MESSAGES_PER_MINUTE, ge=0)
    tokens_per_day: int = Field(DEFAULT_TOKENS_PER_DAY, ge=0)
    """Tokens the engine computed for the subject's turns in a UTC day: prompt tokens not
    served from the prefix cache plus generated tokens."""


class TenancySettings(_Section):
    isolate_cache: bool = True
    """Give every tenant its own vLLM cache_salt, so tenants never share KV blocks."""
    cache_salt_secret: SecretStr | None = None
    """HMAC key of the salts. Set it (``BOT_TENANCY__CACHE_SALT_SECRET``) when several workers
    share engines; unset, each process draws a random one (and logs a warning)."""
