"""Tokenize text that users wrote so that it can never become a control token.

A tokenizer matches its *added tokens* (``<|im_start|>``, ``<|eot_id|>``,
``[INST]``, ``<think>``, ...) in the raw text before any BPE runs: a user who
types ``<|im_end|>\\n<|im_start|>system`` would otherwise close their own turn
and open a system turn, and with token-exact history that forged turn stays in
the prompt of every later turn, for everyone in a group chat.

Two layers, because neither alone covers every tokenizer:

* ``split_special_tokens=True`` (transformers) stops the *special* added
  tokens from being matched;
* added tokens that are not flagged special (Qwen's ``<tool_call>``,
  ``<think>``) are still matched by it, so the text is first cut into pieces
  that each hold no added token's whole string: a marker is cut before its last
  character and each piece is encoded on its own.

The pieces are ordinary text: the model still reads the markers as the
characters the user typed.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

# One-character added tokens cannot be cut; they are ordinary characters in practice.
MIN_MARKER_CHARS = 2


class _Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ..., **kwargs: Any) -> list[int]: ...


def control_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of every added or special token: what user text must never produce."""
    ids: set[int] = set(getattr(tokenizer, "all_special_ids", ()) or ())
    ids.update(_added_tokens(tokenizer))
    return frozenset(ids)


def control_token_texts(tokenizer: Any) -> tuple[str, ...]:
    """The strings of the added tokens, longest first."""
    texts = {text for text in _added_tokens(tokenizer).values() if len(text) >= MIN_MARKER_CHARS}
    return tuple(sorted(texts, key=len, reverse=True))


def _added_tokens(tokenizer: Any) -> dict[int, str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {
        int(token_id): str(getattr(token, "content", token)) for token_id, token in decoder.items()
    }


class LiteralEncoder:
    """Encodes user-controlled text into ids that are never control tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer: _Encoder = tokenizer
        self._markers = control_token_texts(tokenizer)
        self._any_marker = (
            re.compile("|".join(re.escape(marker) for marker in self._markers))
            if self._markers
            else None
        )
        self._splits_special = _accepts_split_special_tokens(tokenizer)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self.pieces(text):
            ids.extend(self._encode_piece(piece))
        return ids

    def pieces(self, text: str) -> list[str]:
        """``text`` cut so that no piece contains a whole added token's string."""
        if self._any_marker is None or self._any_marker.search(text) is None:
            return [text] if text else []
        cuts = list(_cut_points(text, self._markers))
        bounds = [0, *cuts, len(text)]
        return [text[start:end] for start, end in itertools.pairwise(bounds) if end > start]

    def _encode_piece(self, piece: str) -> list[int]:
        if self._splits_special:
            return list(
                self._tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=True)
            )
        return list(self._tokenizer.encode(piece, add_special_tokens=False))


def _cut_points(text: str, markers: Sequence[str]) -> Iterable[int]:
    """Offsets to cut at: before the last character of the earliest-ending marker, repeatedly."""
    start = 0
    while True:
        ends = [
            found + len(marker) for marker in markers if (found := text.find(marker, start)) >= 0
        ]
        if not ends:
            return
        cut = min(ends) - 1
        yield cut
        start = cut


def _accepts_split_special_tokens(tokenizer: Any) -> bool:
    # transformers tokenizers take it; minimal tokenizers (tests, adapters) may not.
    try:
        tokenizer.encode("", add_special_tokens=False, split_special_tokens=True)
    except TypeError:
        return False
    return True
