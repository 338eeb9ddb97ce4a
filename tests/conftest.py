"""Shared fixtures: the real vLLM engine (once per session), real databases, the real app.

* ``engine`` — one in-process vLLM ``AsyncLLM`` on the tiny demo model, started
  once per test session (about 30 s) and shared by every app under test.
* ``db_url`` — a fresh, migrated database per test, on SQLite and on the local
  PostgreSQL (tests using it run once per backend).
* ``make_client`` — builds the real aiohttp app around ``engine`` and a
  database, serves it on 127.0.0.1 and returns a ``TestClient``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.apikeys import create_key
from bot.config import EngineSettings, Settings, load_settings
from bot.engine.vllm_local import LocalVLLMEngine
from bot.models.demo_model import build_demo_model
from bot.storage.db import create_engine, create_sessionmaker, is_sqlite
from bot.storage.migrate import upgrade
from bot.turns.chat_format import ChatFormat, load_tokenizer

POSTGRES_ADMIN_DSN = os.environ.get(
    "BOT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TEST_MAX_MODEL_LEN = 1024
TEST_BLOCK_SIZE = 32
TEST_SYSTEM_PROMPT = "You are a test assistant."

# The slow tier: tests that start processes of their own (served workers, vLLM servers, the
# real model, an engine in a subprocess) or run hundreds of turns. `make test` leaves them
# out; `make test-slow` runs them alone, `make test-all` (what CI runs) runs both tiers.
SLOW_TESTS = (
    "tests/remote/",
    "tests/discord/test_gateway_workers.py",
    "tests/realmodel/",
    "tests/test_log_levels.py",
    "tests/test_engine_priority.py",
    "tests/test_bench_runs.py",
    "tests/test_chat_client.py",
    "tests/ops/test_export_while_serving.py",
    "tests/ops/test_first_steps.py",
    "tests/ops/test_child_environment.py",
    "tests/ops/test_model_pull.py",
    "tests/security/test_database_url.py",
    "tests/test_event_streams.py::test_readers_of_a_queued_turn_who_leave",
    "tests/turns/test_compaction.py::test_hundreds_of_turns",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
    # A renamed file or test would quietly move into the fast tier: refuse the run instead.
    for entry in SLOW_TESTS:
        where = entry.split("::")[0]
        if not Path(__file__).parent.parent.joinpath(where).exists():
            raise pytest.UsageError(f"SLOW_TESTS names {where}, which does not exist")
        collected = any(item.nodeid.startswith(where) for item in items)
        if collected and not any(item.nodeid.startswith(entry) for item in items):
            raise pytest.UsageError(f"SLOW_TESTS names {entry}, which matches no test")


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cached = os.environ.get("BOT_TEST_MODEL_DIR")
    target = Path(cached) if cached else tmp_path_factory.mktemp("model") / "demo-model"
    return build_demo_model(target)


@pytest.fixture(scope="session")
def engine_settings(demo_model_dir: Path) -> EngineSettings:
    return EngineSettings(
        model=str(demo_model_dir),
        dtype="float32",
        max_model_len=TEST_MAX_MODEL_LEN,
        block_size=TEST_BLOCK_SIZE,
        enforce_eager=True,
        seed=0,
        cpu_kvcache_space_gib=1,
    )


@pytest.fixture(scope="session")
async def engine(engine_settings: EngineSettings) -> AsyncIterator[LocalVLLMEngine]:
    vllm_engine = LocalVLLMEngine(engine_settings)
    await vllm_engine.start()
    yield vllm_engine
    await vllm_engine.shutdown()


@pytest.fixture(scope="session")
def chat_format(demo_model_dir: Path) -> ChatFormat:
    return ChatFormat(load_tokenizer(str(demo_model_dir)), TEST_SYSTEM_PROMPT)


async def _create_postgres_database() -> str:
    name = f"bot_test_{uuid.uuid4().hex[:12]}"
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return name


async def _drop_postgres_database(name: str) -> None:
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


def postgres_url(database: str) -> str:
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    return f"{base}/{database}"


@pytest.fixture
async def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A brand-new, empty database; the backend comes from the test's ``backend`` param."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'bot.db'}"
        return
    name = await _create_postgres_database()
    try:
        yield postgres_url(name)
    finally:
        await _drop_postgres_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh database migrated to head, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'bot.db'}"
        await migrate(url)
        yield url
        return
    async with migrated_postgres_database() as url:
        yield url


@asynccontextmanager
async def migrated_postgres_database() -> AsyncIterator[str]:
    """A fresh PostgreSQL database migrated to head, dropped afterwards."""
    name = await _create_postgres_database()
    try:
        url = postgres_url(name)
        await migrate(url)
        yield url
    finally:
        await _drop_postgres_database(name)


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """A fresh migrated PostgreSQL database, for tests of several workers sharing one."""
    async with migrated_postgres_database() as url:
        yield url


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> str:
    """A fresh migrated SQLite database, for tests whose subject is not the backend."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'bot.db'}"
    await migrate(url)
    return url


async def migrate(url: str) -> None:
    # Alembic's env runs its own event loop: keep it off the test loop.
    await asyncio.to_thread(upgrade, url)


def make_settings(db_url: str, engine_settings: EngineSettings, **sections: Any) -> Settings:
    overrides: dict[str, Any] = {
        "database": {"url": db_url},
        "engine": engine_settings.model_dump(mode="json"),
        "generation": {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0},
        "chat": {"system_prompt": TEST_SYSTEM_PROMPT},
        "server": {"shutdown_grace_s": 5.0},
    }
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(overrides.get(section), dict):
            overrides[section] = {**overrides[section], **values}
        else:
            overrides[section] = values
    return load_settings(None, **overrides)


MakeClient = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
async def make_client(
    engine: LocalVLLMEngine, engine_settings: EngineSettings, chat_format: ChatFormat
) -> AsyncIterator[MakeClient]:
    """``await make_client(db_url, **sections)``: the real app on 127.0.0.1, shared engine."""
    from bot.app import create_app

    clients: list[TestClient[Any, Any]] = []
    serving_sqlite: dict[str, TestClient[Any, Any]] = {}

    async def factory(
        db_url: str, *, engine_override: Any = None, **sections: Any
    ) -> TestClient[Any, Any]:
        if is_sqlite(db_url) and db_url in serving_sqlite:
            # One server per SQLite file, as `botctl serve` enforces with its lock file:
            # two live apps would each poll for queued turns and run the other's.
            await serving_sqlite.pop(db_url).close()
        settings = make_settings(db_url, engine_settings, **sections)
        app = await create_app(settings, engine=engine_override or engine, chat_format=chat_format)
        client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        if is_sqlite(db_url):
            serving_sqlite[db_url] = client
        return client

    yield factory
    for client in clients:
        await client.close()


async def issue_key(db_url: str, name: str = "alice", owner: str | None = None) -> str:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            issued = await create_key(session, name=name, owner=owner)
        return issued.key
    finally:
        await engine.dispose()
