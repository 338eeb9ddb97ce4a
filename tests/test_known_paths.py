"""A history read through ``KnownPaths`` is the history the database holds, id for id.

The cache only saves reading again what was read before; these tests walk a
conversation's tree the way turns, edits, regenerations and compactions move
its head, on SQLite and PostgreSQL, and compare every read with a fresh one.
"""

from __future__ import annotations

from sqlalchemy import delete, update

from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.known_paths import KnownPath, KnownPaths
from bot.storage.models import Conversation, Message
from bot.storage.queries import BASE_ROLE, History, load_history
from bot.storage.tokens import pack_token_ids


class Tree:
    """A conversation whose entries are added one by one; each entry's ids are unique."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self.sessions = create_sessionmaker(self.engine)
        self.conversation_id = ""
        self.next_seq = 0

    async def open(self) -> None:
        async with self.sessions() as session, session.begin():
            conversation = Conversation(owner="o", channel="api", external_key="k")
            session.add(conversation)
            await session.flush()
            self.conversation_id = conversation.id

    async def add(self, role: str, parent: int | None) -> int:
        """A new entry under ``parent``, made the head."""
        seq = self.next_seq
        self.next_seq += 1
        async with self.sessions() as session, session.begin():
            session.add(
                Message(
                    conversation_id=self.conversation_id,
                    seq=seq,
                    role=role,
                    text=f"entry {seq}",
                    token_ids=pack_token_ids([1000 + seq * 10 + i for i in range(3)]),
                    parent_seq=parent,
                )
            )
            await session.execute(
                update(Conversation)
                .where(Conversation.id == self.conversation_id)
                .values(head_seq=seq)
            )
        return seq

    async def read(self, known: KnownPaths | None, at: int | None = None) -> History:
        async with self.sessions() as session:
            return await load_history(session, self.conversation_id, at=at, known=known)


def ids(*seqs: int) -> list[int]:
    return [1000 + seq * 10 + i for seq in seqs for i in range(3)]


async def test_reads_through_known_paths_match_the_database(db_url: str) -> None:
    tree = Tree(db_url)
    known = KnownPaths()
    try:
        await tree.open()

        async def same(expected_path: tuple[int, ...], at: int | None = None) -> None:
            fresh = await tree.read(None, at)
            cached = await tree.read(known, at)
            assert cached == fresh
            assert cached.prompt_ids == ids(*expected_path)

        # Turns: the head moves on along one branch.
        u0 = await tree.add("user", None)
        await same((u0,))
        a1 = await tree.add("assistant", u0)
        u2 = await tree.add("user", a1)
        a3 = await tree.add("assistant", u2)
        await same((u0, a1, u2, a3))
        assert (await tree.read(known)).last_assistant_ids == ids(a3)
        u4 = await tree.add("user", a3)
        a5 = await tree.add("assistant", u4)
        await same((u0, a1, u2, a3, u4, a5))

        # A regeneration: a second reply to u4, forked below the known head.
        await same((u0, a1, u2, a3, u4), at=u4)
        a6 = await tree.add("assistant", u4)
        await same((u0, a1, u2, a3, u4, a6))
        # An edit of u2: a sibling of it under a1, then a reply.
        u7 = await tree.add("user", a1)
        a8 = await tree.add("assistant", u7)
        await same((u0, a1, u7, a8))
        # Back on the other branch, past the known head's seq but not through it.
        u9 = await tree.add("user", a6)
        await same((u0, a1, u2, a3, u4, a6, u9))

        # A compaction's base: the prompt restarts there, on the known path's branch.
        base = await tree.add(BASE_ROLE, u9)
        history = await tree.read(known)
        assert history.ends_with_base and history == await tree.read(None)
        a11 = await tree.add("assistant", base)
        u12 = await tree.add("user", a11)
        await same((base, a11, u12))
        assert (await tree.read(known)).last_assistant_ids == ids(a11)
    finally:
        await tree.engine.dispose()


async def test_a_known_path_is_not_read_again(db_url: str) -> None:
    tree = Tree(db_url)
    known = KnownPaths()
    try:
        await tree.open()
        u0 = await tree.add("user", None)
        a1 = await tree.add("assistant", u0)
        await tree.read(known)
        u2 = await tree.add("user", a1)
        # The entries read before are no longer fetched: only u2 is.
        async with tree.sessions() as session, session.begin():
            await session.execute(delete(Message).where(Message.seq == u0))
        assert (await tree.read(known)).prompt_ids == ids(u0, a1, u2)
        assert (await tree.read(None)).prompt_ids == ids(a1, u2)  # a fresh walk ends at the gap
    finally:
        await tree.engine.dispose()


def test_only_the_most_recent_conversations_are_kept() -> None:
    known = KnownPaths(conversations=2)
    for name in ("a", "b", "c"):
        known.put(name, KnownPath(0, b"", b"", "user"))
    known.get("b")
    known.put("d", KnownPath(0, b"", b"", "user"))
    assert len(known) == 2
    assert known.get("a") is None and known.get("c") is None
    assert known.get("b") is not None and known.get("d") is not None
