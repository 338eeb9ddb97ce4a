"""A process's first message finds the statements on its way compiled (``bot.warm_up``).

SQLAlchemy compiles a statement the first time a process runs it: the first message
after a start paid for every statement of its key's check, its accept and its history
read (13 ms before its first token against 4.5 for the next, with SmolLM2). The
service runs them once at start, storing nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import event, select
from sqlalchemy.exc import OperationalError
from structlog.testing import capture_logs

from bot.app import create_app
from bot.engine.settings import EngineSettings
from bot.engine.vllm_local import LocalVLLMEngine
from bot.storage.db import SERVICE_POOL, create_engine, create_sessionmaker, is_sqlite
from bot.storage.models import ApiKey, UsageCounter
from bot.turns.chat_format import ChatFormat
from tests.conftest import MakeClient, issue_key, make_settings
from tests.helpers import (
    app_sync_engines,
    assert_nothing_stored,
    auth,
    count_rows,
    read_sse,
    recorded_statements,
)


def left_cold_on_postgresql(statement: str) -> bool:
    """A claim's lease, written by the unit of work on the claimed turn's row, and the
    event stream's look at the turn it follows (another worker may run it): each runs
    only for a turn that exists, which the warm-up does not store."""
    return statement.startswith("UPDATE turns SET lease_owner=") or (
        statement.startswith("SELECT turns.id,")
        and statement.endswith("FROM turns \nWHERE turns.id = $1::VARCHAR")
    )


async def stored_counts(db_url: str) -> tuple[int, int]:
    """Fair use's counters, and the keys whose last use was noted."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            counters = len((await session.scalars(select(UsageCounter))).all())
            used = (await session.scalars(select(ApiKey.last_used_at))).all()
            return counters, sum(1 for when in used if when is not None)
    finally:
        await engine.dispose()


async def test_a_first_message_compiles_nothing_before_its_reply_and_the_warm_up_stores_nothing(
    db_url: str, make_client: MakeClient
) -> None:
    key = await issue_key(db_url)
    client = await make_client(db_url)
    await assert_nothing_stored(db_url)
    assert await stored_counts(db_url) == (0, 0)

    with recorded_statements(*app_sync_engines(client.app), compiled_only=True) as compiled:
        response = await client.post(
            "/v1/messages",
            json={"conversation_id": "c1", "message_id": "m1", "text": "hello"},
            headers={**auth(key), "Accept": "text/event-stream"},
        )
        assert response.status == 200
        # Up to the reply's first event: the key's check, the accept, the history read.
        await response.content.readline()
        on_the_way = list(compiled)
    await response.read()
    if not is_sqlite(db_url):
        on_the_way = [s for s in on_the_way if not left_cold_on_postgresql(s)]
    assert on_the_way == [], "\n\n".join(on_the_way)
    assert (await stored_counts(db_url))[0] >= 1  # the real message's count, as before


async def test_a_warm_up_that_fails_is_logged_and_the_service_starts_and_answers(
    db_url: str,
    engine: LocalVLLMEngine,
    engine_settings: EngineSettings,
    chat_format: ChatFormat,
) -> None:
    """The rehearsed accept's turn fails to go in, like a lost connection: the service
    logs it, starts, has stored nothing of the rehearsal, and answers its first message."""
    key = await issue_key(db_url)
    app = await create_app(
        make_settings(db_url, engine_settings), engine=engine, chat_format=chat_format
    )
    raised: list[str] = []

    def lose_the_turn(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "INSERT INTO turns" in statement and not raised:
            raised.append(statement)
            raise OperationalError(statement, params, ConnectionResetError("injected fault"))

    engines = app_sync_engines(app)
    for sync_engine in engines:
        event.listen(sync_engine, "before_cursor_execute", lose_the_turn)
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    try:
        with capture_logs() as logs:
            await client.start_server()
        assert raised, "the rehearsal stored no turn"
        failed = [line for line in logs if line["event"] == "warm_up_failed"]
        assert [line["error_class"] for line in failed] == ["OperationalError"]
        await assert_nothing_stored(db_url)
        assert await stored_counts(db_url) == (0, 0)

        response = await client.post(
            "/v1/messages",
            json={"conversation_id": "c1", "message_id": "m1", "text": "hello"},
            headers={**auth(key), "Accept": "text/event-stream"},
        )
        events = await read_sse(response)
        assert events[-1].kind == "done", events[-1].data
        counts = await count_rows(db_url)
        assert (counts["conversations"], counts["turns"]) == (1, 1)
    finally:
        await client.close()
        for sync_engine in engines:
            event.remove(sync_engine, "before_cursor_execute", lose_the_turn)


async def test_on_postgresql_a_burst_of_first_messages_after_a_start_opens_no_connection(
    pg_url: str, make_client: MakeClient
) -> None:
    """The warm-up opens each pool's connections (PostgreSQL), so the first messages after
    a start, all at once, are stored and answered on connections already open."""
    key = await issue_key(pg_url)
    client = await make_client(pg_url)
    opened: list[object] = []

    def count(*_: Any) -> None:
        opened.append(None)

    engines = app_sync_engines(client.app)
    for sync_engine in engines:
        event.listen(sync_engine, "connect", count)
    try:
        responses = await asyncio.gather(
            *(
                client.post(
                    "/v1/messages",
                    json={"conversation_id": f"c{n}", "message_id": "m1", "text": "hello"},
                    headers={**auth(key), "Accept": "text/event-stream"},
                )
                for n in range(SERVICE_POOL["pool_size"])
            )
        )
        for response in responses:
            assert (await read_sse(response))[-1].kind == "done"
    finally:
        for sync_engine in engines:
            event.remove(sync_engine, "connect", count)
    assert opened == []
