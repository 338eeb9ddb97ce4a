"""Recently read history paths, kept so a turn reads only the entries added since.

A conversation's prompt is the concatenation of the entries on its path
(``bot.storage.queries.load_history``). Entries are never changed once written
and are deleted only with their conversation, whose id is never used again: a
path read from the database stays right for as long as it is kept. The
database remains the truth about *which* entry is the head; this only saves
walking, fetching and unpacking the part of the path that was read before, so
a turn's history costs the same at the 400th turn as at the 4th.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_CONVERSATIONS = 1024
"""Conversations whose last path is kept: at 4 bytes a token, a full 8k-token prompt is 32 KB."""


@dataclass(frozen=True)
class KnownPath:
    """The path from the root (or its latest base) down to ``head_seq``, packed."""

    head_seq: int
    prompt: bytes
    """Every entry's packed token ids, in order (``bot.storage.tokens``)."""
    last_assistant: bytes
    last_role: str


class KnownPaths:
    """The last path read for each of the most recently active conversations (LRU)."""

    def __init__(self, conversations: int = DEFAULT_CONVERSATIONS) -> None:
        self._capacity = conversations
        self._paths: OrderedDict[str, KnownPath] = OrderedDict()

    def get(self, conversation_id: str) -> KnownPath | None:
        path = self._paths.get(conversation_id)
        if path is not None:
            self._paths.move_to_end(conversation_id)
        return path

    def put(self, conversation_id: str, path: KnownPath) -> None:
        self._paths[conversation_id] = path
        self._paths.move_to_end(conversation_id)
        while len(self._paths) > self._capacity:
            self._paths.popitem(last=False)

    def __len__(self) -> int:
        return len(self._paths)
