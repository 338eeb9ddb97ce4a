"""/healthz, /readyz and /metrics on the real app, around the real engine and databases."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import event, make_url, update

from bot.apikeys import REFRESH_EVERY_S
from bot.app import create_app
from bot.engine.base import GenerationChunk, GenerationRequest
from bot.engine.settings import EngineSettings
from bot.errors import EngineError, ErrorClass
from bot.http.keys import DB_PROBE, TURNS
from bot.http.ops import READY_CHECK_TIMEOUT_S
from bot.ops.metrics import note_rate_limited
from bot.ops.recent_answer import FRESH_S
from bot.storage.db import create_engine, create_probe_engine, create_sessionmaker, is_sqlite
from bot.storage.models import ApiKey, utcnow
from bot.turns.chat_format import ChatFormat
from tests.conftest import POSTGRES_ADMIN_DSN, MakeClient, issue_key, make_settings
from tests.helpers import admin_key, auth, load_turns, terminate_backends
from tests.ops.helpers import chat, samples, value


class SickEngine:
    """The real engine, except that its health check reports it dead."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.max_model_len = engine.max_model_len

    async def start(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        return self._engine.generate(request)  # type: ignore[no-any-return]

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def check_health(self) -> None:
        raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "vLLM engine core died")

    async def shutdown(self) -> None: ...


class LateEngine(SickEngine):
    """The real engine, whose health check answers ``late_s`` late."""

    def __init__(self, engine: Any, late_s: float) -> None:
        super().__init__(engine)
        self.late_s = late_s

    async def check_health(self) -> None:
        await asyncio.sleep(self.late_s)
        await self._engine.check_health()


async def test_healthz_and_readyz_answer_on_a_started_app(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    assert (await (await client.get("/healthz")).json()) == {"status": "alive"}
    response = await client.get("/readyz")
    assert response.status == 200
    assert await response.json() == {"status": "ready"}


async def test_readyz_is_503_naming_the_engine_when_it_is_dead(
    sqlite_url: str, make_client: MakeClient, engine: Any
) -> None:
    client = await make_client(sqlite_url, engine_override=SickEngine(engine))
    response = await client.get("/readyz")
    assert response.status == 503
    body = await response.json()
    assert body["status"] == "not_ready"
    assert body["reason"].startswith("engine:")
    assert "core died" not in json.dumps(body), "the exception's text stays in the log"
    assert (await client.get("/healthz")).status == 200  # alive, just not ready


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_readyz_is_503_naming_the_database_when_it_goes_away(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    assert (await client.get("/readyz")).status == 200
    name = db_url.rsplit("/", 1)[1]
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await connection.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await connection.close()
    # Statements that completed before the drop (the poller's) count for FRESH_S.
    await asyncio.sleep(FRESH_S)
    response = await client.get("/readyz")
    assert response.status == 503
    assert (await response.json())["reason"].startswith("database:")


async def test_readyz_takes_statements_that_just_completed_for_the_database_answering(
    db_url: str,
    engine: Any,
    engine_settings: EngineSettings,
    chat_format: ChatFormat,
    tmp_path: Path,
) -> None:
    """Under load the check's own round trip waits behind the very statements that show the
    database answers, and can miss its timeout (bot.ops.recent_answer): while they complete, the
    service is ready whatever the probe says; once they stop, the probe decides."""
    # No poller statements in between: the test decides when the database last answered.
    settings = make_settings(db_url, engine_settings, workers={"poll_interval_s": 60})
    app = await create_app(settings, engine=engine, chat_format=chat_format)
    # A probe that cannot get through, as a check that misses its timeout.
    cut_off = (
        f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/bot.db"
        if is_sqlite(db_url)
        else "postgresql+asyncpg://127.0.0.1:1/test"
    )
    app[DB_PROBE] = probe = create_probe_engine(cut_off, one_round_trip=True)
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        key = await issue_key(db_url)
        assert (await chat(client, key, "c1", "m1"))["kind"] == "done"
        response = await client.get("/readyz")
        assert response.status == 200, await response.text()
        # The key's checks in the background (bot.apikeys.keep_keys_fresh) are statements
        # the database answers too: revoked, the key is read once more and then no longer.
        database = create_engine(db_url)
        async with create_sessionmaker(database)() as session, session.begin():
            await session.execute(update(ApiKey).values(revoked_at=utcnow()))
        await database.dispose()
        await asyncio.sleep(REFRESH_EVERY_S + FRESH_S + 0.2)
        response = await client.get("/readyz")
        assert response.status == 503
        assert (await response.json())["reason"] == "database: not answering"
    finally:
        await client.close()
        await probe.dispose()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_readyz_stays_200_when_the_server_cut_its_kept_connection(
    db_url: str, make_client: MakeClient
) -> None:
    """The check keeps one connection and sends only its statement (no ping first): a
    connection cut since the last check (a restart, a kill) is replaced, not reported."""
    # Without the poller's statements (nor time for earlier ones to count) each check is the
    # probe's round trip.
    client = await make_client(db_url, workers={"poll_interval_s": 60})
    await asyncio.sleep(FRESH_S)
    assert (await client.get("/readyz")).status == 200
    assert await terminate_backends(db_url, "query = 'SELECT 1'") == 1
    await asyncio.sleep(0.2)  # the cut reaches the client side
    response = await client.get("/readyz")
    assert response.status == 200, await response.text()
    assert (await client.get("/readyz")).status == 200


async def _probe_backend(db_url: str) -> int:
    """The server process of the readiness check's kept connection, if this test may stop
    it: a PostgreSQL process of this host that this user can signal."""
    url = make_url(db_url).set(drivername="postgresql")
    admin = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        pids = await admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND query = 'SELECT 1'"
            " AND pid <> pg_backend_pid()",
            url.database,
        )
    finally:
        await admin.close()
    assert len(pids) == 1, pids
    pid = int(pids[0]["pid"])
    try:
        if not psutil.Process(pid).name().startswith("postgres"):
            pytest.skip("the database server's processes are not this host's")
        os.kill(pid, 0)
    except (psutil.Error, PermissionError):
        pytest.skip("the database server's processes are not this host's, or not ours to stop")
    return pid


async def _timed_readyz(client: TestClient[Any, Any]) -> tuple[ClientResponse, float]:
    """``/readyz``'s answer and the seconds it took."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    response = await client.get("/readyz")
    return response, loop.time() - began


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_readyz_does_not_count_the_event_loops_lag_against_the_database(
    db_url: str, make_client: MakeClient
) -> None:
    """A busy process reads the database's answer late: that is not the database failing.
    Here the answer comes 0.3 s after the check asked, while the event loop is held for
    longer than the check's whole timeout (as 150 requests arriving at once held it in CI)."""
    client = await make_client(db_url, workers={"poll_interval_s": 60})
    await asyncio.sleep(FRESH_S)
    assert (await client.get("/readyz")).status == 200  # the probe's connection is kept
    backend = await _probe_backend(db_url)
    asked = asyncio.Event()
    event.listen(
        client.server.app[DB_PROBE].sync_engine, "before_cursor_execute", lambda *_: asked.set()
    )
    os.kill(backend, signal.SIGSTOP)  # the server takes its time: the check surely waits
    resume = threading.Timer(0.3, os.kill, (backend, signal.SIGCONT))
    try:
        check = asyncio.create_task(client.get("/readyz"))
        await asyncio.wait_for(asked.wait(), 10)
        resume.start()
        time.sleep(READY_CHECK_TIMEOUT_S + 0.5)  # noqa: ASYNC251 (the loop held, on purpose)
        response = await check
    finally:
        resume.cancel()
        os.kill(backend, signal.SIGCONT)
    assert response.status == 200, await response.text()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_readyz_is_503_when_the_database_holds_the_connection_but_never_answers(
    db_url: str, make_client: MakeClient
) -> None:
    """A server that keeps the connection open and does not answer (stopped, swapped out,
    stuck) is reported after the check's timeout, not after the statement's cancellation
    has unwound, and ready again once it answers."""
    client = await make_client(db_url, workers={"poll_interval_s": 60})
    await asyncio.sleep(FRESH_S)
    assert (await client.get("/readyz")).status == 200
    backend = await _probe_backend(db_url)
    os.kill(backend, signal.SIGSTOP)
    try:
        response, took = await _timed_readyz(client)
    finally:
        os.kill(backend, signal.SIGCONT)
    assert response.status == 503
    assert (await response.json())["reason"] == "database: not answering"
    # Before, 5 s: the check waited for the cancelled statement to give its connection up.
    assert READY_CHECK_TIMEOUT_S <= took < READY_CHECK_TIMEOUT_S + 1.5
    await asyncio.sleep(FRESH_S)
    response = await client.get("/readyz")
    assert response.status == 200, await response.text()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_readyz_waits_for_the_slower_check_not_for_their_sum(
    db_url: str, make_client: MakeClient, engine: Any
) -> None:
    """A probe (Docker's, a load balancer's) gives up after seconds of its own: a database
    and an engine that each answer 2 s late are ready within about 2 s, not 4."""
    late_s = 2.0
    client = await make_client(
        db_url, workers={"poll_interval_s": 60}, engine_override=LateEngine(engine, late_s)
    )
    await asyncio.sleep(FRESH_S)
    assert (await client.get("/readyz")).status == 200  # the probe's connection is kept
    backend = await _probe_backend(db_url)
    await asyncio.sleep(FRESH_S)
    os.kill(backend, signal.SIGSTOP)
    resume = threading.Timer(late_s, os.kill, (backend, signal.SIGCONT))
    resume.start()
    try:
        response, took = await _timed_readyz(client)
    finally:
        resume.cancel()
        os.kill(backend, signal.SIGCONT)
    assert response.status == 200, await response.text()
    assert late_s <= took < 1.5 * late_s


async def test_metrics_need_an_admin_scope_key_on_the_main_port(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/metrics", headers=auth("bot_nope_nope"))).status == 401
    chat_key = await issue_key(sqlite_url)
    response = await client.get("/metrics", headers=auth(chat_key))
    assert response.status == 403
    assert (await response.json())["error"] == "forbidden"
    response = await client.get("/metrics", headers=auth(await admin_key(sqlite_url)))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    assert "bot_turns_in_flight 0.0" in await response.text()


async def test_metrics_after_turns_match_the_database(db_url: str, make_client: MakeClient) -> None:
    client = await make_client(
        db_url, server={"max_text_chars": 100_000, "max_body_bytes": 1_000_000}
    )
    key = await issue_key(db_url)
    for i in range(2):
        assert (await chat(client, key, "c1", f"m{i}"))["kind"] == "done"
    huge = " ".join(f"word{i}" for i in range(3000))
    failed = await chat(client, key, "c2", "m0", huge)
    assert failed["error_class"] == "context_overflow"
    await client.server.app[TURNS].wait_idle(timeout=30)
    note_rate_limited("telegram")  # what a channel client calls on a 429

    response = await client.get("/metrics", headers=auth(await admin_key(db_url)))
    values = samples(await response.text())
    turns = await load_turns(db_url)
    done = [turn for turn in turns if turn.status == "done"]
    assert len(done) == 2

    assert value(values, "bot_turns_total", channel="api", status="done", error_class="") == 2
    assert (
        value(
            values,
            "bot_turns_total",
            channel="api",
            status="failed",
            error_class="context_overflow",
        )
        == 1
    )
    assert value(values, "bot_tokens_total", kind="completion") == sum(
        turn.completion_tokens or 0 for turn in turns
    )
    # The failed turn's prompt was counted too: it was tokenized, just not sent.
    assert value(values, "bot_tokens_total", kind="prompt") == sum(
        turn.prompt_tokens or 0 for turn in turns
    )
    assert value(values, "bot_tokens_total", kind="cached") == sum(
        turn.cached_tokens or 0 for turn in done
    )
    assert value(values, "bot_tokens_total", kind="cached") > 0  # turn 2 reused turn 1's blocks
    for layer in (
        "auth",
        "persist",
        "history",
        "tokenize",
        "queue",
        "prefill",
        "decode",
        "deliver",
    ):
        assert value(values, "bot_turn_layer_seconds_count", layer=layer) >= 2, layer
    assert value(values, "bot_turn_ttft_seconds_count") == 2
    assert value(values, "bot_turn_e2e_seconds_count", status="done") == 2
    assert value(values, "bot_turn_e2e_seconds_count", status="failed") == 1
    assert value(values, "bot_deliveries_total", platform="api", outcome="delivered") == 2
    assert value(values, "bot_platform_rate_limited_total", platform="telegram") == 1
    assert value(values, "bot_turns_in_flight") == 0


async def test_in_flight_gauge_counts_running_turns(
    sqlite_url: str, make_client: MakeClient, engine: Any
) -> None:
    from tests.ops.slow_engine import SlowEngine

    client = await make_client(sqlite_url, engine_override=SlowEngine(engine, delay_s=0.1))
    key = await issue_key(sqlite_url)
    ops = await admin_key(sqlite_url)
    posted = await client.post(
        "/v1/messages",
        json={"conversation_id": "c", "message_id": "m", "text": "Hi"},
        headers=auth(key),
    )
    assert posted.status == 202
    turns = client.server.app[TURNS]
    async with asyncio.timeout(10):
        while turns.in_flight == 0:  # noqa: ASYNC110 - the service exposes no event for it
            await asyncio.sleep(0.01)
    values = samples(await (await client.get("/metrics", headers=auth(ops))).text())
    assert value(values, "bot_turns_in_flight") == 1
    await turns.wait_idle(timeout=30)
    values = samples(await (await client.get("/metrics", headers=auth(ops))).text())
    assert value(values, "bot_turns_in_flight") == 0
