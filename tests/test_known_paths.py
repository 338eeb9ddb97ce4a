"""A history read through ``KnownPaths`` is the history the database holds, id for id.

The cache only saves reading again what was read before; these tests walk a
conversation's tree the way turns, edits, regenerations and compactions move
its head, on SQLite and PostgreSQL, and compare every read with a fresh one.
"""

from __future__ import annotations

from sqlalchemy import delete, update

from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.history import History, load_history
from bot.storage.known_paths import KnownPath, KnownPaths
from bot.storage.models import BASE_ROLE, Conversation, Message
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

    def entry(self, role: str, parent: int | None) -> Message:
        """The next entry under ``parent`` (not stored yet)."""
        seq = self.next_seq
        self.next_seq += 1
        return Message(
            conversation_id=self.conversation_id,
            seq=seq,
            role=role,
            text=f"entry {seq}",
            token_ids=pack_token_ids(ids(seq)),
            parent_seq=parent,
        )

    async def store(self, *entries: Message) -> None:
        """Store ``entries`` (copies: the caller's stay unattached) and make the last the head."""
        async with self.sessions() as session, session.begin():
            for entry in entries:
                copy = Message(
                    conversation_id=entry.conversation_id,
                    seq=entry.seq,
                    role=entry.role,
                    text=entry.text,
                    token_ids=entry.token_ids,
                    parent_seq=entry.parent_seq,
                )
                session.add(copy)
            await session.execute(
                update(Conversation)
                .where(Conversation.id == self.conversation_id)
                .values(head_seq=entries[-1].seq)
            )

    async def add(self, role: str, parent: int | None) -> int:
        """A new entry under ``parent``, made the head."""
        entry = self.entry(role, parent)
        await self.store(entry)
        return entry.seq

    async def forget_entries(self) -> None:
        """Every entry deleted, the head left as it was: a read that fetches sees a gap."""
        async with self.sessions() as session, session.begin():
            await session.execute(
                delete(Message).where(Message.conversation_id == self.conversation_id)
            )

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


async def test_entries_stored_at_the_end_of_a_known_path_are_not_read_again(db_url: str) -> None:
    tree = Tree(db_url)
    known = KnownPaths()
    try:
        await tree.open()
        # A conversation's first turn: nothing was read before it; its entries start the path.
        first = [tree.entry("user", None), tree.entry("assistant", 0)]
        await tree.store(*first)
        known.extend(tree.conversation_id, first)
        assert await tree.read(known) == await tree.read(None)
        # The next turn's: they continue the known head.
        second = [tree.entry("user", 1), tree.entry("assistant", 2)]
        await tree.store(*second)
        known.extend(tree.conversation_id, second)
        fresh = await tree.read(None)
        assert await tree.read(known) == fresh
        assert fresh.prompt_ids == ids(0, 1, 2, 3) and fresh.last_assistant_ids == ids(3)

        # Nothing of it is fetched again: with every entry gone, the known path still
        # answers (only the head is read), where a walk finds nothing.
        await tree.forget_entries()
        assert (await tree.read(known)).prompt_ids == ids(0, 1, 2, 3)
        assert (await tree.read(None)).prompt_ids == []
    finally:
        await tree.engine.dispose()


async def test_entries_that_do_not_continue_a_known_path_leave_it_to_be_read(db_url: str) -> None:
    tree = Tree(db_url)
    known = KnownPaths()
    try:
        await tree.open()
        u0 = await tree.add("user", None)
        await tree.add("assistant", u0)
        await tree.read(known)

        # A regeneration's reply, under u0 while a1 is the known head: a fork.
        fork = [tree.entry("assistant", u0)]
        await tree.store(*fork)
        known.extend(tree.conversation_id, fork)
        assert known.get(tree.conversation_id) is None
        assert await tree.read(known) == await tree.read(None)

        # A compaction's base under the known head: the prompt restarts there.
        base = [tree.entry(BASE_ROLE, fork[0].seq), tree.entry("assistant", fork[0].seq + 1)]
        await tree.store(*base)
        known.extend(tree.conversation_id, base)
        assert known.get(tree.conversation_id) is None
        history = await tree.read(known)
        assert history == await tree.read(None) and history.prompt_ids == ids(3, 4)

        # Entries of a conversation none is known of (evicted), not its first: nothing.
        known = KnownPaths()
        later = [tree.entry("user", 4)]
        await tree.store(*later)
        known.extend(tree.conversation_id, later)
        assert known.get(tree.conversation_id) is None
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
