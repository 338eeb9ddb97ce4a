"""Two real vLLM OpenAI servers (started once per session, in parallel) and a misbehaving one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.config import EngineSettings
from bot.engine.base import GenerationChunk, GenerationRequest
from bot.engine.openai_remote import OpenAIRemoteEngine
from bot.testing.vllm_servers import API_KEY, SERVED_MODEL_NAME, VLLMServer, start_servers
from tests.remote.misbehaving import MisbehavingServer


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


def request(
    prompt: list[int], session_key: str | None = None, max_tokens: int = 24
) -> GenerationRequest:
    return GenerationRequest(
        request_id=uuid.uuid4().hex,
        prompt_token_ids=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        top_p=1.0,
        session_key=session_key,
    )


async def collect(engine: object, req: GenerationRequest) -> tuple[list[int], GenerationChunk]:
    ids: list[int] = []
    final = None
    async for chunk in engine.generate(req):  # type: ignore[attr-defined]
        ids.extend(chunk.token_ids)
        if chunk.finished:
            final = chunk
    assert final is not None
    return ids, final


async def engine_for(base_urls: list[str], **overrides: object) -> OpenAIRemoteEngine:
    engine = OpenAIRemoteEngine(remote_settings(base_urls, **overrides))
    await engine.start()
    return engine
