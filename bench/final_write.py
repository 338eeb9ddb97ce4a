"""Benchmark: what one turn's final write costs the event loop, next to the ORM's way.

Every turn ends with one transaction (``TurnEndings``' final write): its final
status (``UPDATE turns ... RETURNING``), its user and assistant entries, fair
use's charge of its tokens and the conversation's new head. It runs on the event
loop (on SQLite in place, with the write lock held) while every other chat's turn
waits for it. Here N of them run back to back in one process with nothing else on
its event loop: wall-clock and CPU ms per final write, on SQLite and
(``--database``) PostgreSQL. Next to them, the same transaction the ORM's way,
as the service wrote it before: the UPDATE loading the whole ``Turn`` row as an
object, the charge through the session.

Run:  .venv/bin/python bench/final_write.py
      .venv/bin/python bench/final_write.py --database postgresql+asyncpg://127.0.0.1/test
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accept import message, timed
from harness import add_database_servers, scratch_database
from sqlalchemy import bindparam, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.config import load_settings
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Message, Turn, TurnStatus
from bot.storage.tokens import pack_token_ids
from bot.turns import ending
from bot.turns.ending import TurnEnd, TurnEndings, final_columns
from bot.turns.limits import _CHARGE, DAY_S, TOKEN_METRICS, FairUse, subjects_for
from bot.turns.service import TurnService
from bot.turns.streams import TurnStreams

REPLY_IDS = list(range(1000, 1048))
"""A reply of 48 tokens, as ``bench/turns.py`` asks for."""
USER_IDS = list(range(2000, 2030))


def _end() -> TurnEnd:
    return TurnEnd(
        TurnStatus.DONE,
        text="A reply of forty-eight tokens, more or less, as the turns benchmark asks.",
        prompt_tokens=600,
        cached_tokens=560,
        completion_tokens=len(REPLY_IDS),
        finish_reason="length",
        timings_ms={"ingress": 0.2, "persist": 1.5, "ttft": 60.0, "e2e": 2000.0},
    )


def _history(conversation_id: str, turn_id: str) -> list[Message]:
    """The turn's user and assistant entries (a conversation's first exchange)."""
    return [
        Message(
            conversation_id=conversation_id,
            seq=0,
            role="user",
            text="Hello there, how are you today?",
            token_ids=pack_token_ids(USER_IDS),
            turn_id=turn_id,
            parent_seq=None,
        ),
        Message(
            conversation_id=conversation_id,
            seq=1,
            role="assistant",
            text=_end().text,
            token_ids=pack_token_ids(REPLY_IDS),
            turn_id=turn_id,
            parent_seq=0,
        ),
    ]


_ORM_FINISH = (
    update(Turn)
    .where(Turn.id == bindparam("turn_id"), Turn.status.not_in(TurnStatus.FINAL))
    .values({name: bindparam(f"final_{name}") for name in final_columns(_end())})
    .returning(Turn)
    .execution_options(synchronize_session=False)
)


async def orm_final_write(
    sessions: async_sessionmaker[AsyncSession], turn_id: str, history: Sequence[Message]
) -> None:
    """The final write as before: ``Turn`` loaded by the UPDATE, charged through the session."""
    end = _end()
    async with sessions() as session, session.begin():
        final = {f"final_{name}": value for name, value in final_columns(end).items()}
        row = (await session.scalars(_ORM_FINISH, {"turn_id": turn_id, **final})).one()
        await (await session.connection()).execute(
            ending._INSERT_ENTRIES, ending._entry_rows(history)
        )
        tokens = (row.prompt_tokens or 0) - (row.cached_tokens or 0) + (row.completion_tokens or 0)
        subjects = subjects_for(api_key_id=row.api_key_id, channel=row.channel, user_id=row.user_id)
        dialect = session.get_bind().dialect.name
        for subject in subjects:
            await session.execute(
                _CHARGE[dialect],
                {"subject": subject, "metric": TOKEN_METRICS[0], "window": DAY_S, "amount": tokens},
            )
        await (await session.connection()).execute(
            ending._MOVE_HEAD, {"conversation_id": row.conversation_id, "new_head_seq": 1}
        )


async def final_writes(url: str, n: int, *, orm: bool) -> tuple[float, float]:
    """Wall-clock and CPU ms per final write of a turn that answered its conversation's
    first message (a conversation each, accepted beforehand)."""
    engine = create_engine(url)
    sessions = create_sessionmaker(engine)
    # The turns to end: accepted as the service accepts them, left queued (no engine).
    service = TurnService(sessions, TurnStreams())
    service.schedule = lambda conversation_id: None  # type: ignore[method-assign]
    run = uuid.uuid4().hex[:8]
    turns: dict[int, tuple[str, str]] = {}
    for i in range(n + 200):  # ``timed`` warms up with 200 more
        accepted = await service.accept(message(run, i, first=True))
        turns[i] = (accepted.turn_id, accepted.conversation_id)
    endings = TurnEndings(sessions, TurnStreams())
    charge = FairUse(load_settings(None).limits).charge_turn

    async def one(i: int) -> None:
        turn_id, conversation_id = turns[i]
        history = _history(conversation_id, turn_id)
        if orm:
            await orm_final_write(sessions, turn_id, history)
        else:
            stored = await endings._store(turn_id, _end(), history, charge, None)
            assert stored is None, stored

    try:
        return await timed(n, one)
    finally:
        await engine.dispose()


async def main(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-final-write-"))
    print(f"# {args.n} final writes in a row per line, one process, a conversation each;")
    print("# load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'database':<12} {'what':<52} {'wall ms':>8} {'cpu ms':>8}")
    for server in [None, *args.database]:
        name = "SQLite" if server is None else "PostgreSQL"
        rows: list[tuple[str, Any]] = []
        async with scratch_database(workdir, server) as url:
            rows.append(("the service's final write", await final_writes(url, args.n, orm=False)))
        async with scratch_database(workdir, server) as url:
            rows.append(
                (
                    "the ORM's way (UPDATE ... RETURNING Turn)",
                    await final_writes(url, args.n, orm=True),
                )
            )
        for what, (wall, cpu) in rows:
            print(f"{name:<12} {what:<52} {wall:>8.2f} {cpu:>8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000, help="final writes per line")
    add_database_servers(parser)
    asyncio.run(main(parser.parse_args()))
