"""Before the first request: run once what a message runs on its way to its first token.

A process compiles each SQL statement the first time it runs it (SQLAlchemy; on
PostgreSQL asyncpg also prepares it on that connection). The first message after a
start paid for all of them: 13 ms of the service's own time before its first token
where the next ones took 4.5 (``bench/turns.py --conversations 1 --model
data/smollm2``; its key's check 6.6 ms instead of 0.1, its accept 9.8 instead of
1.5, its history 2.7 instead of 0.6). Here they run once at start, storing nothing:
a key no one has is checked, an accept is rehearsed for an owner no one is
(``TurnService.rehearse``: rolled back), and a turn's claim, start and history read
run for a conversation that does not exist.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.apikeys import rehearse_key_check
from bot.channels.api.kind import API
from bot.storage.models import new_id
from bot.turns.inbound import InboundMessage
from bot.turns.runner import TurnRunner
from bot.turns.service import TurnService

log = structlog.get_logger(__name__)

REHEARSAL_OWNER = "rehearsal:"
"""Prefix of the owner a rehearsed accept is for (a new id after it): not a key's
owner nor a platform's, so no conversation of anyone's is ever found or written."""


def rehearsal_message() -> InboundMessage:
    """An API message of an owner no one is, to a conversation no one has."""
    return InboundMessage(
        channel=API.name,
        event_id=new_id(),
        owner=f"{REHEARSAL_OWNER}{new_id()}",
        conversation_key=new_id(),
        text="",
        user_id=new_id(),
        api_key_id=new_id(),
    )


async def warm_up(
    turns: TurnService,
    runner: TurnRunner,
    *,
    key_reads: async_sessionmaker[AsyncSession],
    connections: int = 1,
) -> None:
    """Check a made-up key, rehearse an API message's accept, claim, start and history.

    ``key_reads``: the request handlers' reads (a key's check runs there). A failure
    is logged and the service starts anyway: the first message then pays as before.

    ``connections`` (PostgreSQL: a pool's size, its connections opened already,
    ``ServiceEngines.open_pools``): that many rehearsals at once, spread over them:
    asyncpg prepares a statement on each connection the first time it runs there,
    one round trip more, which a burst of first messages after a start paid on
    every connection at once.
    """
    started = time.perf_counter()
    try:
        await asyncio.gather(
            *(_rehearse(turns, runner, key_reads) for _ in range(max(1, connections)))
        )
    except Exception as exc:  # a warm-up is never a reason not to start
        log.warning("warm_up_failed", error_class=type(exc).__name__)
        return
    log.info(
        "warmed_up", ms=round((time.perf_counter() - started) * 1000, 1), connections=connections
    )


async def _rehearse(
    turns: TurnService, runner: TurnRunner, key_reads: async_sessionmaker[AsyncSession]
) -> None:
    await rehearse_key_check(key_reads)
    await turns.rehearse(rehearsal_message())
    if turns.runs_turns:
        await turns.claims.rehearse()
        await runner.rehearse()
