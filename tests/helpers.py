"""Small helpers shared by the tests: SSE parsing and database inspection."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientResponse
from sqlalchemy import event, func, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.engine.interfaces import CacheStats
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.apikeys import create_key
from bot.http.keys import DB_ENGINES
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation, InboundEvent, Message, Turn
from bot.storage.tokens import unpack_token_ids

# The layers the issue names for the per-turn line, written out here on purpose:
# checking against the code's own constant would prove nothing.
SPEC_LAYERS = (
    "ingress",
    "auth",
    "persist",
    "history",
    "tokenize",
    "queue",
    "prefill",
    "decode",
    "deliver",
)


@dataclass(frozen=True)
class SseEvent:
    event_id: str
    kind: str
    data: dict[str, Any]


async def read_sse(response: ClientResponse) -> list[SseEvent]:
    """Read a whole SSE response into events (the stream ends after done/error)."""
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events: list[SseEvent] = []
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith(":"):
            continue  # a comment (keep-alive), ignored as EventSource ignores it
        if not line:
            if fields:
                events.append(
                    SseEvent(fields.get("id", ""), fields["event"], json.loads(fields["data"]))
                )
                fields = {}
            continue
        name, _, value = line.partition(": ")
        fields[name] = value
    return events


def reply_text(events: list[SseEvent]) -> str:
    return "".join(event.data["text"] for event in events if event.kind == "delta")


async def count_rows(db_url: str) -> dict[str, int]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            counts = {}
            for model in (Conversation, Turn, InboundEvent, Message):
                counts[model.__tablename__] = int(
                    await session.scalar(select(func.count()).select_from(model)) or 0
                )
            return counts
    finally:
        await engine.dispose()


async def terminate_backends(pg_url: str, condition: str) -> int:
    """Cut the PostgreSQL connections to ``pg_url``'s database that match ``condition``
    (SQL on ``pg_stat_activity``), as a server restart or a network fault would; how many."""
    url = make_url(pg_url).set(drivername="postgresql")
    admin = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        cut = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            f" WHERE datname = $1 AND pid <> pg_backend_pid() AND ({condition})",
            url.database,
        )
    finally:
        await admin.close()
    return int(cut)


async def load_turns(db_url: str) -> list[Turn]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            return list((await session.scalars(select(Turn).order_by(Turn.created_at))).all())
    finally:
        await engine.dispose()


async def load_messages(
    db_url: str, conversation_id: str
) -> list[tuple[str, list[int], str | None]]:
    """(role, token ids, turn id) of a conversation's history entries, in order."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            rows = (
                await session.execute(
                    select(Message.role, Message.token_ids, Message.turn_id)
                    .where(Message.conversation_id == conversation_id)
                    .order_by(Message.seq)
                )
            ).all()
            return [(role, unpack_token_ids(ids), turn_id) for role, ids, turn_id in rows]
    finally:
        await engine.dispose()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def load_history_rows(db_url: str) -> list[Message]:
    """Every history entry, by conversation and position."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            query = select(Message).order_by(Message.conversation_id, Message.seq)
            return list((await session.scalars(query)).all())
    finally:
        await engine.dispose()


async def wait_until(predicate: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``predicate()`` held; fails after ``timeout_s``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


DEEP = 60_000


HUGE_DIGITS = 5_000


def nested(depth: int, *, closed: bool) -> bytes:
    return b"[" * depth + (b"]" * depth if closed else b"")


def huge_integer_field(field: str) -> bytes:
    document = json.dumps({"conversation_id": "c1", "message_id": "m1", "text": "hi"})
    return document[:-1].encode() + f', "{field}": {"9" * HUGE_DIGITS}}}'.encode()


async def assert_nothing_stored(db_url: str) -> None:
    assert set((await count_rows(db_url)).values()) == {0}


async def refusal(response: Any, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    body: dict[str, Any] = await response.json()
    assert set(body) >= {"error", "reason"}
    return body


async def admin_key(db_url: str) -> str:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            return (await create_key(session, name="ops", scopes=("admin",))).key
    finally:
        await engine.dispose()


async def store_turns(
    sessions: async_sessionmaker[AsyncSession],
    *,
    owner: str,
    channel: str,
    key: str,
    turns: list[tuple[dt.datetime, str, str | None, int | None, int | None, int | None]],
) -> None:
    """One conversation and its turns: (created_at, status, user_id, prompt, cached, completion)."""
    async with sessions() as session, session.begin():
        conversation = Conversation(owner=owner, channel=channel, external_key=key)
        session.add(conversation)
        await session.flush()
        for seq, (created, status, user_id, prompt, cached, completion) in enumerate(turns):
            session.add(
                Turn(
                    conversation_id=conversation.id,
                    seq=seq,
                    channel=channel,
                    user_id=user_id,
                    user_text="hi",
                    status=status,
                    prompt_tokens=prompt,
                    cached_tokens=cached,
                    completion_tokens=completion,
                    created_at=created,
                )
            )


PIRATE_PROMPT = "You are a pirate captain. Answer in pirate speak, arr."
PERSONAS: list[dict[str, Any]] = [
    {
        "name": "pirate",
        "description": "Talks like a pirate",
        "system_prompt": PIRATE_PROMPT,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 7,
    },
    {"name": "terse", "system_prompt": "Answer in one word."},
]


async def conversations_in(db_url: str) -> list[Conversation]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            query = select(Conversation).order_by(Conversation.created_at)
            return list((await session.scalars(query)).all())
    finally:
        await engine.dispose()


async def conversation_personas(db_url: str) -> dict[str, str | None]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            rows = await session.execute(select(Conversation.external_key, Conversation.persona))
            return {key: persona for key, persona in rows}
    finally:
        await engine.dispose()


def app_sync_engines(app: Any) -> list[Engine]:
    """The app's database engines (the requests' and the turns'; one on SQLite), sync side."""
    return [engine.sync_engine for engine in app[DB_ENGINES].distinct]


@contextmanager
def recorded_statements(*sync_engines: Engine, compiled_only: bool = False) -> Iterator[list[str]]:
    """Every SQL statement the ``sync_engines`` send while the block runs, in order;
    ``compiled_only``: only those compiled meanwhile (their engine's compiled cache missed)."""
    statements: list[str] = []

    def record(
        _conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, *_: Any
    ) -> None:
        if not compiled_only or getattr(context, "cache_hit", None) is CacheStats.CACHE_MISS:
            statements.append(statement)

    for sync_engine in sync_engines:
        event.listen(sync_engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        for sync_engine in sync_engines:
            event.remove(sync_engine, "before_cursor_execute", record)


@contextmanager
def plain_executes() -> Iterator[list[str]]:
    """What asyncpg sends as plain executes while the block runs: BEGIN and COMMIT reach
    the server that way, not as statements (``recorded_statements`` does not see them)."""
    plain: list[str] = []
    execute = asyncpg.Connection.execute

    async def recorded(connection: asyncpg.Connection, query: str, *args: Any) -> Any:
        plain.append(query)
        return await execute(connection, query, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(asyncpg.Connection, "execute", recorded)
        yield plain
