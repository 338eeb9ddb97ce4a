"""Cutting a long reply into messages of at most ``limit`` characters.

Cuts fall on a paragraph, then a line, then a word boundary when one lies in
the last part of the window, so no message ends mid-word unless a single
word is longer than the window. A cut inside a fenced code block closes the
fence and reopens it in the next message, so both halves render as code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE_LINE = re.compile(r"^\s*(```|~~~)", re.MULTILINE)
CLOSE_FENCE = "\n```"
_REOPEN = "```\n"
# A boundary earlier than this share of the window wastes too much of a message.
_MIN_CUT_SHARE = 0.5


@dataclass(frozen=True)
class Cut:
    piece: str
    """The message text, fence closed if the cut fell inside a code block."""
    consumed: int
    """Characters of the input this piece used up."""
    carry: str
    """Prefix for the next message: reopens a fence, else empty."""


def _cut_index(text: str, limit: int, min_index: int) -> int:
    window = text[:limit]
    floor = max(int(limit * _MIN_CUT_SHARE), min_index)
    for boundary in ("\n\n", "\n", " "):
        index = window.rfind(boundary)
        if index + len(boundary) > floor:
            return index + len(boundary)
    return max(limit, min_index)


def first_cut(text: str, limit: int, *, min_index: int = 0) -> Cut | None:
    """Where the first message of ``text`` ends, or None when it all fits in one.

    ``min_index``: characters already streamed into this message, which a cut
    can no longer take back (a stream only appends).
    """
    if len(text) <= limit:
        return None
    # Keep room for a fence that may have to be closed.
    index = _cut_index(text, limit - len(CLOSE_FENCE), min_index)
    piece = text[:index]
    if len(_FENCE_LINE.findall(piece)) % 2:
        # Only ever appended to, so a stream that already sent ``piece`` can send the close.
        return Cut(piece + ("```" if piece.endswith("\n") else CLOSE_FENCE), index, _REOPEN)
    return Cut(piece, index, "")


def split(text: str, limit: int) -> list[str]:
    """All messages of ``text``; used for the final state of a reply."""
    pieces: list[str] = []
    while (cut := first_cut(text, limit)) is not None:
        pieces.append(cut.piece)
        text = cut.carry + text[cut.consumed :]
    pieces.append(text)
    return pieces
