"""A prepared base rolled forward along a conversation's path, and the ones kept in memory.

A prepared base (``bot.turns.preparation``) describes the path up to the entry it
was prepared after. The conversation goes on; the base a switch writes is that one
*rolled forward*: the prepared ids, the first user entry since re-rendered after a
closed reply (it was stored after an open one, its closing first), every later
entry id for id, then the last reply's closing. Rolling forward is one rule, used
both on entries read from the database and on the entries a turn just stored.

Each worker keeps, per conversation, the rolled-forward base of the last path it
saw (``RolledBases``): extended in memory with each turn's entries as the turn
ends, so the turn that switches bases finds it without reading anything, even
when it comes right after the previous one. Entries are never changed once
written, so a rolled base describes its path for good; it is used only for a
history whose head *and* prompt ids are exactly the path's (``at``), which also
rules out a path whose entries were never committed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from bot.storage.history import History
from bot.storage.models import BASE_ROLE, Message
from bot.storage.tokens import unpack_token_ids
from bot.turns.chat_format import ChatFormat

DEFAULT_CONVERSATIONS = 1024
"""Conversations whose rolled base is kept: each holds about two prompts' worth of ids."""


@dataclass(frozen=True)
class PathStep:
    """One history entry as rolling forward needs it."""

    seq: int
    role: str
    text: str
    ids: list[int]

    @classmethod
    def of(cls, entry: Message) -> PathStep:
        return cls(entry.seq, entry.role, entry.text, unpack_token_ids(entry.token_ids))


@dataclass(frozen=True)
class RolledBase:
    """A prepared base rolled forward to the path that ends at ``head_seq``."""

    head_seq: int | None
    path_ids: list[int]
    """That path's prompt (``History.prompt_ids``): the base describes only this history."""
    open_ids: list[int]
    """The prepared ids and the entries since, without the last reply's closing."""
    closing_ids: list[int]
    """The last reply's closing; empty while no entry follows the prepared ones."""
    exchanges: int
    """Whole exchanges since the prepared ones."""
    first_seq: int | None
    """The first entry since the prepared ones (None: none yet)."""
    summary: str | None
    kept_from_seq: int | None
    dropped_exchanges: int
    kept_exchanges: int

    @property
    def base_ids(self) -> list[int]:
        return self.open_ids + self.closing_ids

    def extended(self, chat_format: ChatFormat, steps: Sequence[PathStep]) -> RolledBase | None:
        """Rolled forward over ``steps`` (the path's next entries, in order).

        None when they are not whole exchanges (a user entry, then its reply): a
        path the base cannot describe.
        """
        if not steps:
            return self
        ids = list(self.open_ids)
        path_ids = list(self.path_ids)
        first_seq = self.first_seq
        exchanges = self.exchanges
        expected = "user"
        for step in steps:
            if step.role != expected:
                return None
            if first_seq is None:
                # Stored after an open reply (its closing first): re-rendered after a closed one.
                first_seq = step.seq
                ids += chat_format.turn_after_closed(step.text).token_ids
            else:
                ids += step.ids
            path_ids += step.ids
            if step.role == "assistant":
                exchanges += 1
            expected = "assistant" if step.role == "user" else "user"
        if expected != "user":
            return None  # ends with a user entry: no reply to close
        return replace(
            self,
            head_seq=steps[-1].seq,
            path_ids=path_ids,
            open_ids=ids,
            closing_ids=chat_format.closing_ids(steps[-1].ids),
            exchanges=exchanges,
            first_seq=first_seq,
        )


class RolledBases:
    """Each recently active conversation's rolled base in this worker (LRU)."""

    def __init__(self, conversations: int = DEFAULT_CONVERSATIONS) -> None:
        self._capacity = conversations
        self._rolled: OrderedDict[str, RolledBase] = OrderedDict()
        self._prefilled: dict[str, int | None] = {}
        """The head of the path whose base was last handed out to be prefilled."""

    def get(self, conversation_id: str) -> RolledBase | None:
        return self._rolled.get(conversation_id)

    def at(self, conversation_id: str, history: History) -> RolledBase | None:
        """The rolled base that describes exactly ``history``, if this worker has it."""
        rolled = self._rolled.get(conversation_id)
        if rolled is None or rolled.head_seq != history.head_seq:
            return None
        if rolled.path_ids != history.prompt_ids:
            return None
        return rolled

    def head_seq(self, conversation_id: str) -> int | None:
        rolled = self._rolled.get(conversation_id)
        return rolled.head_seq if rolled is not None else None

    def to_prefill(self, conversation_id: str) -> RolledBase | None:
        """The kept base, unless it was handed out to be prefilled for this path already."""
        rolled = self._rolled.get(conversation_id)
        if rolled is None or self._prefilled.get(conversation_id, -2) == rolled.head_seq:
            return None
        self._prefilled[conversation_id] = rolled.head_seq
        return rolled

    def put(self, conversation_id: str, rolled: RolledBase) -> None:
        """Keep ``rolled``, unless a later path's is kept already.

        Background work reads the history some time before it puts its result:
        meanwhile a turn may have ended and rolled the base further (``extend``).
        Seqs are given in insertion order, so the later path's head is the larger.
        """
        kept = self._rolled.get(conversation_id)
        if kept is not None and kept.head_seq is not None:
            if rolled.head_seq is None or rolled.head_seq < kept.head_seq:
                return
            if rolled.head_seq == kept.head_seq and rolled.base_ids == kept.base_ids:
                return  # the same base, perhaps prefilled already
        self._keep(conversation_id, rolled)

    def drop(self, conversation_id: str) -> None:
        self._rolled.pop(conversation_id, None)
        self._prefilled.pop(conversation_id, None)

    def _keep(self, conversation_id: str, rolled: RolledBase) -> None:
        self._rolled[conversation_id] = rolled
        self._prefilled.pop(conversation_id, None)
        self._rolled.move_to_end(conversation_id)
        while len(self._rolled) > self._capacity:
            evicted, _ = self._rolled.popitem(last=False)
            self._prefilled.pop(evicted, None)

    def extend(
        self, conversation_id: str, chat_format: ChatFormat, stored: Sequence[Message]
    ) -> RolledBase | None:
        """A turn's entries were stored: roll the kept base over them, or forget it.

        Entries that do not continue its path (a regeneration, an edit, a new base)
        leave nothing kept: the background reads the history again.
        """
        rolled = self._rolled.get(conversation_id)
        if rolled is None or not stored:
            return None
        continues = stored[0].parent_seq == rolled.head_seq and all(
            entry.role != BASE_ROLE and entry.parent_seq == parent.seq
            for parent, entry in pairwise(stored)
        )
        extended = (
            rolled.extended(chat_format, [PathStep.of(entry) for entry in stored])
            if continues and stored[0].role != BASE_ROLE
            else None
        )
        if extended is None:
            self.drop(conversation_id)
            return None
        self._keep(conversation_id, extended)
        return extended
