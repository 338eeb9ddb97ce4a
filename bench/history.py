"""Benchmark: what reading a turn's history costs as a conversation grows.

Every turn reads its prompt's token ids, the entries on the path from the
root (or the latest compaction base) down to the head, before it can go to the
engine. Here a conversation of N entries, one branch, 60 tokens an entry, and
``load_history`` timed two ways, on SQLite and (``--database``) PostgreSQL:

- whole path: the walk over every entry, as without ``KnownPaths`` (after a
  restart, or a conversation new to this worker);
- known path: the path up to the previous turn's head known from a read, so only
  the last user and assistant entries are fetched;
- stored path: the turn's usual case, the previous turn's entries known since its
  final write committed (``KnownPaths.extend``), so only the head is read.

Run:  .venv/bin/python bench/history.py
      .venv/bin/python bench/history.py --database postgresql+asyncpg://127.0.0.1/test
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from harness import add_database_servers, scratch_database
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage.db import create_engine, create_read_sessionmaker, create_sessionmaker, is_sqlite
from bot.storage.known_paths import KnownPaths
from bot.storage.models import Conversation, Message
from bot.storage.queries import load_history
from bot.storage.tokens import pack_token_ids

TOKENS_PER_ENTRY = 60


Sessions = async_sessionmaker[AsyncSession]


async def make_conversation(sessions: Sessions, entries: int) -> str:
    async with sessions() as session, session.begin():
        conversation = Conversation(
            owner="bench", channel="api", external_key=f"k{entries}", head_seq=entries - 1
        )
        session.add(conversation)
        await session.flush()
        session.add_all(
            Message(
                conversation_id=conversation.id,
                seq=seq,
                role="user" if seq % 2 == 0 else "assistant",
                text="x" * 200,
                token_ids=pack_token_ids(range(seq, seq + TOKENS_PER_ENTRY)),
                parent_seq=seq - 1 if seq else None,
            )
            for seq in range(entries)
        )
        return str(conversation.id)


async def whole_path_ms(reads: Sessions, conversation_id: str) -> float:
    started = time.perf_counter()
    async with reads() as session:
        await load_history(session, conversation_id)
    return (time.perf_counter() - started) * 1000


async def known_path_ms(reads: Sessions, conversation_id: str, head: int) -> float:
    # The previous turn's path (two entries shorter) is known; the new head is not.
    known = KnownPaths()
    async with reads() as session:
        await load_history(session, conversation_id, at=head - 2, known=known)
    started = time.perf_counter()
    async with reads() as session:
        await load_history(session, conversation_id, known=known)
    return (time.perf_counter() - started) * 1000


async def stored_path_ms(reads: Sessions, conversation_id: str, entries: list[Message]) -> float:
    # The previous turn's path is known from a read and the last two entries from the
    # final write that stored them.
    known = KnownPaths()
    async with reads() as session:
        await load_history(session, conversation_id, at=entries[0].seq - 1, known=known)
    known.extend(conversation_id, entries)
    started = time.perf_counter()
    async with reads() as session:
        await load_history(session, conversation_id, known=known)
    return (time.perf_counter() - started) * 1000


def last_two(conversation_id: str, entries: int) -> list[Message]:
    """The path's last user and assistant entries, as a turn's final write stores them."""
    return [
        Message(
            conversation_id=conversation_id,
            seq=seq,
            role="user" if seq % 2 == 0 else "assistant",
            token_ids=pack_token_ids(range(seq, seq + TOKENS_PER_ENTRY)),
            parent_seq=seq - 1,
        )
        for seq in (entries - 2, entries - 1)
    ]


async def run(url: str, lengths: list[int], repeats: int) -> None:
    engine = create_engine(url)
    sessions = create_sessionmaker(engine)
    reads = create_read_sessionmaker(engine, in_place=True) if is_sqlite(url) else sessions
    try:
        for entries in lengths:
            conversation_id = await make_conversation(sessions, entries)
            if not is_sqlite(url):
                # As autovacuum does while conversations grow over many turns: a plan that
                # PostgreSQL cached for the table as it was a moment ago (a few rows) joins
                # a path of hundreds of entries to its rows in a nested loop.
                async with engine.begin() as connection:
                    await connection.execute(text("ANALYZE messages"))
            known = KnownPaths()
            async with reads() as session:
                await load_history(session, conversation_id, at=entries - 3, known=known)
                extended = await load_history(session, conversation_id, known=known)
                assert extended == await load_history(session, conversation_id)
                stored = KnownPaths()
                await load_history(session, conversation_id, at=entries - 3, known=stored)
                stored.extend(conversation_id, last_two(conversation_id, entries))
                assert extended == await load_history(session, conversation_id, known=stored)
            whole = [await whole_path_ms(reads, conversation_id) for _ in range(repeats)]
            known_ms = [
                await known_path_ms(reads, conversation_id, entries - 1) for _ in range(repeats)
            ]
            stored_ms = [
                await stored_path_ms(reads, conversation_id, last_two(conversation_id, entries))
                for _ in range(repeats)
            ]
            print(
                f"{entries:>7} {entries * TOKENS_PER_ENTRY:>7}"
                f"   {statistics.median(whole):>10.2f}   {statistics.median(known_ms):>10.2f}"
                f"   {statistics.median(stored_ms):>11.2f}"
            )
    finally:
        await engine.dispose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_servers(parser)
    parser.add_argument("--lengths", default="16,100,400", help="entries on the path")
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"# load_history, median ms of {args.repeats} reads; {TOKENS_PER_ENTRY} tokens an entry")
    with tempfile.TemporaryDirectory() as workdir:
        for server in [None, *args.database]:
            async with scratch_database(Path(workdir), server) as url:
                print(f"\n{'SQLite' if server is None else 'PostgreSQL'}")
                print("entries  tokens   whole path   known path   stored path")
                await run(url, lengths, args.repeats)


if __name__ == "__main__":
    asyncio.run(main())
