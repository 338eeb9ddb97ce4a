"""Personas: named system-prompt presets, each with its own sampling.

A persona is chosen when a conversation starts (``conversations.persona``;
NULL is the default ``chat.system_prompt``) and never changes after: its
system prompt is the first entry of the token-exact history, so switching it
mid-conversation would rewrite the prefix every later prompt (and the engine's
prefix cache) is built on. Choosing another persona starts a new conversation.

The presets come from the operator's configuration (``[[personas]]``); the
turn package owns their type and is handed them, it reads no configuration.
A persona's system prompt is operator text and is rendered as the template
renders any system prompt; the name a user types to choose one is data,
only ever looked up, never rendered into a prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from bot.turns.chat_format import ChatFormat
from bot.turns.settings import GenerationSettings

PERSONA_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"


class PersonaSettings(BaseModel):
    """One ``[[personas]]`` table."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=PERSONA_NAME_PATTERN)
    """What users type (``/mode pirate``): lowercase letters, digits, ``-`` and ``_``."""
    system_prompt: str = Field(min_length=1)
    description: str = ""
    """One line shown where personas are listed (``/mode``, the web page, GET /v1/personas)."""
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, gt=0)
    """Each unset sampling key falls back to ``[generation]``."""


@dataclass(frozen=True)
class PersonaChoice:
    """What a turn of a conversation is generated with: its format and its sampling."""

    name: str | None
    chat_format: ChatFormat
    generation: GenerationSettings


class Personas:
    """The configured presets, looked up by name, with one ``ChatFormat`` built per persona."""

    def __init__(
        self, presets: Sequence[PersonaSettings] = (), *, generation: GenerationSettings
    ) -> None:
        self._presets = {preset.name: preset for preset in presets}
        self._generation = generation
        self._formats: dict[str, ChatFormat] = {}

    @property
    def presets(self) -> list[PersonaSettings]:
        return list(self._presets.values())

    @property
    def names(self) -> list[str]:
        return list(self._presets)

    def get(self, name: str | None) -> PersonaSettings | None:
        """The preset a user named (case-insensitive); None for no or an unknown name."""
        if not name:
            return None
        return self._presets.get(name.strip().lower())

    def generation_for(self, preset: PersonaSettings | None) -> GenerationSettings:
        if preset is None:
            return self._generation
        overrides = {
            key: value
            for key, value in (
                ("temperature", preset.temperature),
                ("top_p", preset.top_p),
                ("max_tokens", preset.max_tokens),
            )
            if value is not None
        }
        return self._generation.model_copy(update=overrides)

    def choice(self, name: str | None, default: ChatFormat) -> PersonaChoice:
        """Format and sampling of a conversation whose persona is ``name``.

        A name no longer configured (the operator removed the preset) falls back
        to the default: the history already holds whatever system prompt it began with.
        """
        preset = self.get(name)
        if preset is None:
            return PersonaChoice(None, default, self._generation)
        chat_format = self._formats.get(preset.name)
        if chat_format is None or chat_format.tokenizer is not default.tokenizer:
            chat_format = default.with_system_prompt(preset.system_prompt)
            self._formats[preset.name] = chat_format
        return PersonaChoice(preset.name, chat_format, self.generation_for(preset))
