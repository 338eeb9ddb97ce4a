"""Token-exact prompts: render only the *new* user turn, never the stored history.

The prompt of turn n+1 is, id for id::

    prompt(n) + generated(n) + closing(n) + new_user_turn(n+1)

``closing`` is whatever the chat template puts after an assistant message
(``<|im_end|>\\n`` for ChatML) minus the end-of-turn token the engine may
already have generated; ``new_user_turn`` is the template's rendering of the
user message plus the generation prompt. Both are derived from the model's own
chat template by rendering a throwaway conversation and cutting at a sentinel,
so this works for any template that renders earlier turns verbatim (ChatML,
Llama 3, Mistral, Gemma, ...). Templates that rewrite earlier turns (e.g.
dropping old reasoning) are detected at start-up and refused with an error:
with them no history can be reused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Stand-ins used only to find where the template puts things.
_SENTINEL_USER = "\x00USER_SENTINEL\x00"
_SENTINEL_ASSISTANT = "\x00ASSISTANT_SENTINEL\x00"
_PROBE_USER = "Hello."
_PROBE_ASSISTANT = "Hi."


class ChatTemplateError(Exception):
    """The model's chat template cannot be extended token-exactly."""


class Tokenizer(Protocol):
    eos_token_id: int | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class UserTurn:
    """The ids a user message appends to the prompt, and the text they were made from."""

    token_ids: list[int]
    content: str


def user_content(text: str, user_name: str | None) -> str:
    """What the model sees as the user message; in group chats it names the speaker."""
    return f"{user_name}: {text}" if user_name else text


class ChatFormat:
    """Builds prompt ids for a conversation from its model's chat template."""

    def __init__(self, tokenizer: Tokenizer, system_prompt: str) -> None:
        self._tokenizer = tokenizer
        self.system_prompt = system_prompt
        self._system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self._closing_ids = self._derive_closing_ids()
        self._history_prefix = self._render(
            [*self._system, _msg("user", _PROBE_USER), _msg("assistant", _PROBE_ASSISTANT)],
            add_generation_prompt=False,
        )
        self._check_prefix_stable()

    # -- template probing ------------------------------------------------------------

    def _render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
        rendered = self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        if not isinstance(rendered, str):  # pragma: no cover - depends on the tokenizer
            raise ChatTemplateError("the chat template did not render to text")
        return rendered

    def _encode(self, text: str) -> list[int]:
        # The template writes any BOS itself: never let the tokenizer add another.
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _derive_closing_ids(self) -> list[int]:
        rendered = self._render(
            [*self._system, _msg("user", _PROBE_USER), _msg("assistant", _SENTINEL_ASSISTANT)],
            add_generation_prompt=False,
        )
        at = rendered.find(_SENTINEL_ASSISTANT)
        if at < 0:
            raise ChatTemplateError("the chat template drops assistant messages")
        return self._encode(rendered[at + len(_SENTINEL_ASSISTANT) :])

    def _check_prefix_stable(self) -> None:
        longer = self._render(
            [
                *self._system,
                _msg("user", _PROBE_USER),
                _msg("assistant", _PROBE_ASSISTANT),
                _msg("user", _SENTINEL_USER),
            ],
            add_generation_prompt=True,
        )
        if not longer.startswith(self._history_prefix):
            raise ChatTemplateError(
                "the chat template re-renders earlier turns differently once a new turn "
                "is added; token-exact history (and prefix caching) is impossible with it"
            )

    # -- prompt building -------------------------------------------------------------

    def first_turn(self, content: str) -> UserTurn:
        """Ids of the very first prompt: system prompt, user message, generation prompt."""
        rendered = self._render([*self._system, _msg("user", content)], add_generation_prompt=True)
        return UserTurn(self._encode(rendered), content)

    def next_turn(self, previous_generated: Sequence[int], content: str) -> UserTurn:
        """Ids to append after the previous reply: its closing, then the new user turn."""
        after = self.turn_after_closed(content)
        return UserTurn(self.closing_ids(previous_generated) + after.token_ids, content)

    def turn_after_closed(self, content: str) -> UserTurn:
        """Ids of a user turn after a history whose last reply is closed (a compacted base)."""
        full = self._render(
            [
                *self._system,
                _msg("user", _PROBE_USER),
                _msg("assistant", _PROBE_ASSISTANT),
                _msg("user", content),
            ],
            add_generation_prompt=True,
        )
        suffix = full[len(self._history_prefix) :]
        return UserTurn(self._encode(suffix), content)

    def render_ids(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool
    ) -> list[int]:
        """Render whole messages with the template and tokenize, once (compaction, summaries)."""
        rendered = self._render(list(messages), add_generation_prompt=add_generation_prompt)
        return self._encode(rendered)

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def closing_ids(self, generated: Sequence[int]) -> list[int]:
        """What closes an assistant turn, given the ids the engine generated for it.

        If the engine stopped on the end-of-turn token, that token is already in
        the history and only the rest of the closing (e.g. a newline) is added.
        """
        closing = self._closing_ids
        if generated and closing and generated[-1] == closing[0]:
            return closing[1:]
        return list(closing)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=False)


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


class ChatFormatSource:
    """The service's one ``ChatFormat``, built on first use and shared.

    The runner renders new turns with it; a channel that must render a history
    it was handed as text (the OpenAI-compatible API) uses the very same one.
    """

    def __init__(self, build: Callable[[], ChatFormat]) -> None:
        self._build = build
        self._built: ChatFormat | None = None

    def get(self) -> ChatFormat:
        if self._built is None:
            self._built = self._build()
        return self._built


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """The model's tokenizer via transformers (local folder, or a cached Hugging Face id)."""
    from transformers import AutoTokenizer

    tokenizer: Tokenizer = AutoTokenizer.from_pretrained(name_or_path)  # type: ignore[assignment]
    return tokenizer
