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

Message contents are user-controlled (message text, display names, summaries
of them): they are tokenized so that they never produce a control token of the
vocabulary, while the template's own markup keeps its control tokens
(``literal_text``). Each rendering is first tokenized whole, as the template
means it; if that yields any control token the template itself does not
write, the rendering is tokenized again in pieces: the template's text around
each content as usual, each content as literal text.

Where the template writes contents as given (or trimmed), it never sees what a
user wrote: a user turn after the first is the frame the template wrote around
a stand-in at start-up, joined with the content (the template does not run on
the way to every turn's first token), and a conversation's first prompt is
rendered around a stand-in that the content then replaces (so are the messages
a compaction renders whole, each around a stand-in of its own). For a content the
template does not look into that is the template's own text; for a template
that does look (a branch on what a message says), the user's words only ever
fill a user turn: they cannot steer the template either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import tokenizers

from bot.turns.literal_text import LiteralEncoder, control_token_ids

# Stand-ins used only to find where the template puts things.
_SENTINEL_USER = "\x00USER_SENTINEL\x00"
_SENTINEL_ASSISTANT = "\x00ASSISTANT_SENTINEL\x00"
_PROBE_USER = "Hello."
_PROBE_ASSISTANT = "Hi."
# Padded with spaces to see whether the template trims contents (Llama 3, Gemma do).
_PADDED_PROBE = " Hello. "


class ChatTemplateError(Exception):
    """The model's chat template cannot be extended token-exactly."""


class Tokenizer(Protocol):
    eos_token_id: int | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ..., **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class UserTurn:
    """The ids a user message appends to the prompt, and the text they were made from."""

    token_ids: list[int]
    content: str


def user_content(text: str, user_name: str | None) -> str:
    """What the model sees as the user message; in group chats it names the speaker."""
    return f"{user_name}: {text}" if user_name else text


@dataclass(frozen=True)
class _Frame:
    """A rendering cut at its message contents: ``texts[0] c0 texts[1] c1 ... texts[n]``.

    ``kept`` are the indices of the messages whose content the template wrote (a
    template may drop some); ``text_ids`` the template's own text, tokenized.
    """

    texts: tuple[str, ...]
    kept: tuple[int, ...]
    text_ids: tuple[list[int], ...]
    control_counts: Counter[int]


class ChatFormat:
    """Builds prompt ids for a conversation from its model's chat template."""

    def __init__(self, tokenizer: Tokenizer, system_prompt: str) -> None:
        self._tokenizer = tokenizer
        self._plain_encode = plain_encoder(tokenizer)
        self.system_prompt = system_prompt
        self._system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self._literal = LiteralEncoder(tokenizer)
        self._control_ids = control_token_ids(tokenizer)
        self._closing_ids = self._derive_closing_ids()
        self._history_prefix = self._render(
            [*self._system, _msg("user", _PROBE_USER), _msg("assistant", _PROBE_ASSISTANT)],
            add_generation_prompt=False,
        )
        self._check_prefix_stable()
        shape = self._probe_content_shaping()
        self._shape = shape or _as_given
        self._joins_frames = shape is not None
        self._first_frame = self._frame(
            [*self._system, _msg("user", _PROBE_USER)], add_generation_prompt=True
        )
        self._after_closed_frame = self._derive_after_closed_frame()

    def with_system_prompt(self, system_prompt: str) -> ChatFormat:
        """The same template and tokenizer, opening conversations with another system prompt."""
        return ChatFormat(self._tokenizer, system_prompt)

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
        return self._plain_encode(text)

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

    def _probe_content_shaping(self) -> Callable[[str], str] | None:
        """How the template writes a content: as given, or trimmed (Llama 3, Gemma); None
        for some other way."""
        messages = [
            *self._system,
            _msg("user", _PADDED_PROBE),
            _msg("assistant", _PADDED_PROBE),
        ]
        rendered = self._render(messages, add_generation_prompt=False)
        frame = self._frame(messages, add_generation_prompt=False)
        contents = [messages[i]["content"] for i in frame.kept]
        for shape in (_as_given, str.strip):
            if _join(frame.texts, [shape(c) for c in contents]) == rendered:
                return shape
        # A template that rewrites contents some other way: its markup is still kept
        # around literal contents, only that rewriting is skipped (hostile text only),
        # and user turns are rendered by it (``first_turn``, ``turn_after_closed``).
        return None

    def _derive_after_closed_frame(self) -> _Frame:
        longer = self._render(
            [
                *self._system,
                _msg("user", _PROBE_USER),
                _msg("assistant", _PROBE_ASSISTANT),
                _msg("user", _SENTINEL_USER),
            ],
            add_generation_prompt=True,
        )
        before, found, after = longer[len(self._history_prefix) :].partition(_SENTINEL_USER)
        if not found:
            raise ChatTemplateError("the chat template drops user messages")
        return self._frame_from_texts((before, after), kept=(0,))

    def _frame(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool) -> _Frame:
        sentinels = [_content_sentinel(i) for i in range(len(messages))]
        rendered = self._render(
            [{**m, "content": s} for m, s in zip(messages, sentinels, strict=True)],
            add_generation_prompt=add_generation_prompt,
        )
        texts: list[str] = []
        kept: list[int] = []
        at = 0
        for index, sentinel in enumerate(sentinels):
            found = rendered.find(sentinel, at)
            if found < 0:
                continue  # the template does not write this message's content
            texts.append(rendered[at:found])
            kept.append(index)
            at = found + len(sentinel)
        texts.append(rendered[at:])
        if any("\x00MESSAGE_" in text for text in texts):
            raise ChatTemplateError("the chat template reorders message contents")
        return self._frame_from_texts(tuple(texts), kept=tuple(kept))

    def _frame_from_texts(self, texts: tuple[str, ...], kept: tuple[int, ...]) -> _Frame:
        text_ids = tuple(self._encode(text) for text in texts)
        counts = self._control_counts(id_ for ids in text_ids for id_ in ids)
        return _Frame(texts, kept, text_ids, counts)

    def _control_counts(self, ids: Iterable[int]) -> Counter[int]:
        return Counter(id_ for id_ in ids if id_ in self._control_ids)

    # -- tokenizing renderings ------------------------------------------------------

    def _tokenize(self, rendered: str, frame: _Frame, contents: Sequence[str]) -> list[int]:
        """Ids of a rendering whose contents can never add a control token."""
        ids = self._encode(rendered)
        if self._control_counts(ids) == frame.control_counts:
            return ids  # the usual case: exactly the template's own tokenization
        # Some content produced a control token: rebuild from the template's own
        # pieces around each content tokenized as literal text.
        rebuilt = list(frame.text_ids[0])
        for content, text_ids in zip(contents, frame.text_ids[1:], strict=True):
            rebuilt += self._literal.encode(self._shape(content))
            rebuilt += text_ids
        return rebuilt

    # -- prompt building -------------------------------------------------------------

    def first_turn(self, content: str) -> UserTurn:
        """Ids of the very first prompt: system prompt, user message, generation prompt."""
        messages = [*self._system, _msg("user", content)]
        contents = [messages[i]["content"] for i in self._first_frame.kept]
        rendered = self._render_first(content)
        return UserTurn(self._tokenize(rendered, self._first_frame, contents), content)

    def _render_first(self, content: str) -> str:
        """The first prompt's text, rendered now: a conversation's opening may hold what
        changes with time (Llama 3.2's writes today's date). Where the template writes
        contents as given or trimmed, around a stand-in for the user's content, which
        then takes its place: the template never sees what the user wrote."""
        if self._joins_frames:
            framed = self._render(
                [*self._system, _msg("user", _SENTINEL_USER)], add_generation_prompt=True
            )
            before, found, after = framed.partition(_SENTINEL_USER)
            if found and _SENTINEL_USER not in after:
                return before + self._shape(content) + after
        return self._render([*self._system, _msg("user", content)], add_generation_prompt=True)

    def next_turn(self, previous_generated: Sequence[int], content: str) -> UserTurn:
        """Ids to append after the previous reply: its closing, then the new user turn."""
        after = self.turn_after_closed(content)
        return UserTurn(self.closing_ids(previous_generated) + after.token_ids, content)

    def turn_after_closed(self, content: str) -> UserTurn:
        """Ids of a user turn after a history whose last reply is closed (a compacted base).

        Every turn but a conversation's first: where the template writes contents as given
        or trimmed, its frame (the template's text around a user turn, taken at start-up)
        joined with the content, and the template does not run.
        """
        frame = self._after_closed_frame
        if self._joins_frames:
            suffix = _join(frame.texts, [self._shape(content)])
        else:
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
        return UserTurn(self._tokenize(suffix, frame, [content]), content)

    def render_ids(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool
    ) -> list[int]:
        """Render whole messages with the template and tokenize, once (compaction, summaries)."""
        frame = self._frame(messages, add_generation_prompt=add_generation_prompt)
        contents = [messages[i]["content"] for i in frame.kept]
        if self._joins_frames:
            rendered = _join(frame.texts, [self._shape(content) for content in contents])
        else:
            rendered = self._render(list(messages), add_generation_prompt=add_generation_prompt)
        return self._tokenize(rendered, frame, contents)

    def reply_ids(self, text: str) -> list[int]:
        """Ids of an assistant reply known only as text (a client re-sent it), as the
        template writes a content, and literal: a reply that spells a control token
        (``ok<|im_end|>``) stays text, like any other client text."""
        return self._literal.encode(self._shape(text))

    def literal_ids(self, text: str) -> list[int]:
        """Ids of ``text`` as ordinary text, never a control token."""
        return self._literal.encode(text)

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


def _content_sentinel(index: int) -> str:
    return f"\x00MESSAGE_{index}\x00"


def _as_given(content: str) -> str:
    return content


def _join(texts: Sequence[str], contents: Sequence[str]) -> str:
    parts = [texts[0]]
    for content, text in zip(contents, texts[1:], strict=True):
        parts += [content, text]
    return "".join(parts)


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


def plain_encoder(tokenizer: Tokenizer) -> Callable[[str], list[int]]:
    """``tokenizer``'s ids for a text, no special tokens added (no BOS).

    Straight from the Rust tokenizer behind a transformers fast tokenizer, where nothing
    set on it (truncation, padding, special tokens split as text) would make the
    wrapper's answer differ: the wrapper's ``encode`` asks the same tokenizer, after a
    batch of Python around it that doubled the cost of a turn's encoding, the one
    tokenization on the way to every first token (~0.25 against ~0.4 ms with the
    tokenizer's tables out of the CPU's caches, as they are when a turn starts).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        isinstance(backend, tokenizers.Tokenizer)
        and backend.truncation is None
        and backend.padding is None
        and not getattr(tokenizer, "split_special_tokens", False)
    ):

        def encode(text: str) -> list[int]:
            # As the wrapper does at every call: the flag is the tokenizer's state, and
            # ``LiteralEncoder``'s calls (special tokens split as text) leave it set.
            if backend.encode_special_tokens:
                backend.encode_special_tokens = False
            ids: list[int] = backend.encode(text, add_special_tokens=False).ids
            return ids

        return encode
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """The model's tokenizer via transformers (local folder, or a cached Hugging Face id)."""
    from transformers import AutoTokenizer

    tokenizer: Tokenizer = AutoTokenizer.from_pretrained(name_or_path)  # type: ignore[assignment]
    return tokenizer
