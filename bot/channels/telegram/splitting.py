"""Split a reply into Telegram-sized messages at sensible boundaries.

Telegram accepts 4096 characters a message. Lengths here are counted in
UTF-16 code units, as Telegram counts entity offsets: never more than code
points, so a chunk that fits by this count fits however Telegram counts.

The chunks are contiguous slices of the text (joined, they give it back), and
every chunk but the last is final: it depends only on the text before its
end, so a growing reply never rewrites a chunk once a later one has started.
The sinks rely on that to finish a message and start the next one mid-stream.
"""

from __future__ import annotations

import re

MAX_MESSAGE_CHARS = 4096
"""Telegram's limit on a message's text, after entities parsing."""

MIN_CHUNK_FRACTION = 0.5
"""A boundary is only taken in the back half of a full chunk; else try the next kind."""

# Preferred boundaries, best first; the chunk ends right after the match.
_BOUNDARIES = (
    re.compile(r"\n[ \t]*\n"),  # paragraph
    re.compile(r"\n"),  # line
    re.compile(r"[.!?…][\"')\]]*[ \t]"),  # sentence
    re.compile(r"[ \t]"),  # word
)


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units: characters outside the BMP count twice."""
    return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)


def _fit(text: str, limit: int) -> int:
    """Longest prefix length (in code points) whose UTF-16 length is at most ``limit``."""
    if utf16_len(text) <= limit:
        return len(text)
    units = 0
    for index, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > limit:
            return index
    return len(text)


def _boundary(window: str) -> int:
    """Where to end a chunk inside ``window`` (a full chunk's worth of text)."""
    floor = int(len(window) * MIN_CHUNK_FRACTION)
    for pattern in _BOUNDARIES:
        best = -1
        for match in pattern.finditer(window):
            if match.end() > floor:
                best = match.end()
        if best > 0:
            return best
    return len(window)


def split_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> list[str]:
    """Cut ``text`` into chunks of at most ``limit`` UTF-16 units each."""
    if limit < 2:  # one astral character takes two units: a smaller limit could never progress
        raise ValueError("limit must be at least 2")
    chunks: list[str] = []
    rest = text
    while utf16_len(rest) > limit:
        cut = _boundary(rest[: _fit(rest, limit)])
        chunks.append(rest[:cut])
        rest = rest[cut:]
    chunks.append(rest)
    return chunks
