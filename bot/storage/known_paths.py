"""Recently read history paths, kept so a turn reads only the entries added since.

A conversation's prompt is the concatenation of the entries on its path
(``bot.storage.history.load_history``). Entries are never changed once written
and are deleted only with their conversation, whose id is never used again: a
path read from the database stays right for as long as it is kept. The
database remains the truth about *which* entry is the head; this only saves
walking, fetching and unpacking the part of the path that was read before, so
a turn's history costs the same at the 400th turn as at the 4th.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from bot.storage.models import BASE_ROLE, Message

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

    def extend(self, conversation_id: str, stored: Sequence[Message]) -> None:
        """``stored``: entries just committed, each the next one's parent, the first the
        child of the known path's head (or the conversation's root): the path now ends
        with them.

        Called once their transaction has committed (``TurnEndings``), so that the
        conversation's next turn finds its whole path here and reads only its head.
        Entries that do not continue the known path (a new base restarts the prompt;
        a fork; no path known) leave nothing known: the next read walks the database.
        """
        if not stored:
            return
        known = self._paths.get(conversation_id)
        if known is None and stored[0].parent_seq is not None:
            return  # a path this worker never read: the next read walks the database
        # With no path known, the entries are the conversation's first and start it.
        prompt = known.prompt if known is not None else b""
        last_assistant = known.last_assistant if known is not None else b""
        parents = [known.head_seq if known is not None else None]
        parents += [entry.seq for entry in stored[:-1]]
        continues = all(
            entry.parent_seq == parent and entry.role != BASE_ROLE
            for entry, parent in zip(stored, parents, strict=True)
        )
        if not continues:
            self._paths.pop(conversation_id, None)
            return
        for entry in stored:
            if entry.role == "assistant":
                last_assistant = entry.token_ids
        prompt = b"".join([prompt, *(entry.token_ids for entry in stored)])
        self.put(
            conversation_id, KnownPath(stored[-1].seq, prompt, last_assistant, stored[-1].role)
        )

    def __len__(self) -> int:
        return len(self._paths)
