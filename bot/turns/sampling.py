"""A turn's own sampling parameters: what its client asked for, stored with the turn.

A turn may run in another worker process, be resumed after a crash or be
continued; every run builds its engine request from the same stored value
(``turns.sampling``, JSON, written by the accept), so the client's parameters
hold wherever and however often the turn runs. ``Sampling`` is that value;
``resolve`` turns it, with the service's ``[generation]`` settings (or the
persona's), into the parameters of one engine request.

Unset fields take the settings' values. ``max_tokens`` is capped by the
settings' ``max_tokens``: a client may ask for fewer tokens, never for more.
A regeneration asks for another reply: at temperature 0 it would be the same
one, so it samples at ``generation.regenerate_temperature`` (unless its client
asked for a temperature of its own) and without a seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from bot.storage.text import storable
from bot.turns.chat_format import ChatFormat
from bot.turns.settings import GenerationSettings

MAX_STOP_STRINGS = 4
"""OpenAI's limit on ``stop``; more is refused at the door."""


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters a client chose for its turn; None: the service's setting."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def as_json(self) -> dict[str, Any] | None:
        """The stored form: the fields set, or None when the client chose nothing."""
        chosen: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "stop":
                if value:
                    chosen["stop"] = list(value)
            elif value is not None:
                chosen[field.name] = value
        return chosen or None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any] | None) -> Sampling:
        """A stored value back (``as_json``); fields it does not know are left out."""
        if not stored:
            return NO_SAMPLING
        known = {field.name for field in fields(cls)}
        values = {name: value for name, value in stored.items() if name in known}
        if "stop" in values:
            values["stop"] = tuple(values["stop"] or ())
        return cls(**values)


NO_SAMPLING = Sampling()


@dataclass(frozen=True)
class ResolvedSampling:
    """The parameters of one engine request (``bot.engine.base.GenerationRequest``)."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    presence_penalty: float
    frequency_penalty: float


def resolve(
    sampling: Sampling, generation: GenerationSettings, *, regeneration: bool = False
) -> ResolvedSampling:
    """``sampling`` over ``generation``'s settings, for a turn (``regeneration``: a
    regenerated reply, which must be able to differ from the first)."""
    temperature = (
        sampling.temperature if sampling.temperature is not None else generation.temperature
    )
    seed = sampling.seed
    if regeneration:
        seed = None  # the same seed would give the same reply again
        if temperature == 0 and generation.regenerate_temperature:
            temperature = generation.regenerate_temperature
    max_tokens = generation.max_tokens
    if sampling.max_tokens is not None:
        max_tokens = min(sampling.max_tokens, max_tokens)
    return ResolvedSampling(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=sampling.top_p if sampling.top_p is not None else generation.top_p,
        seed=seed,
        stop=sampling.stop,
        presence_penalty=sampling.presence_penalty or 0.0,
        frequency_penalty=sampling.frequency_penalty or 0.0,
    )


def ids_before_stop(chat_format: ChatFormat, generated: Sequence[int], text: str) -> list[int]:
    """The ids a reply that a stop string ended leaves in the history.

    vLLM stops once a stop string is complete, and returns the text before it: the
    ids it generated reach past where the string began (its last token may even
    hold text before it and the string together). The history keeps what the
    client was given, ``text``: the generated ids whose text lies wholly before the
    stop string, then whatever of ``text`` is left, as literal text. The next prompt
    continues the conversation the client sees; its cache still covers every id
    kept.
    """
    for kept in range(len(generated), -1, -1):
        before = storable(chat_format.tokenizer.decode(generated[:kept], skip_special_tokens=True))
        if text.startswith(before):
            return [*generated[:kept], *chat_format.literal_ids(text[len(before) :])]
    return chat_format.literal_ids(text)  # pragma: no cover - kept == 0 always matches
