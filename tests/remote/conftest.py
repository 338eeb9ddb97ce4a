"""Two real vLLM OpenAI servers (started once per session, in parallel) and a misbehaving one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.config import EngineSettings
from bot.engine.openai_remote import OpenAIRemoteEngine
from tests.remote.misbehaving import MisbehavingServer
from tests.vllm_servers import API_KEY, SERVED_MODEL_NAME, VLLMServer, start_servers


@pytest.fixture(scope="session")
def vllm_servers(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[VLLMServer]]:
    servers = start_servers(demo_model_dir, tmp_path_factory.mktemp("vllm-logs"))
    print(f"vLLM servers ready in {[round(s.started_s, 1) for s in servers]} s")
    yield servers
    for server in servers:
        server.stop()


def remote_settings(base_urls: list[str], **overrides: object) -> EngineSettings:
    values: dict[str, object] = {
        "kind": "openai",
        "base_urls": base_urls,
        "api_key": SecretStr(API_KEY),
        "served_model_name": SERVED_MODEL_NAME,
        "max_model_len": 1024,
        "request_timeout_s": 30.0,
        "connect_timeout_s": 2.0,
        "retry_backoff_s": 0.01,
        **overrides,
    }
    return EngineSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
async def remote_engine(vllm_servers: list[VLLMServer]) -> AsyncIterator[OpenAIRemoteEngine]:
    live = [server.base_url for server in vllm_servers if not server.killed]
    engine = OpenAIRemoteEngine(remote_settings(live))
    await engine.start()
    yield engine
    await engine.shutdown()


@pytest.fixture
async def misbehaving() -> AsyncIterator[MisbehavingServer]:
    server = MisbehavingServer()
    await server.start()
    yield server
    await server.stop()
