"""The remote engine on two real vLLM OpenAI servers: token-exact streaming, affinity, failures.

The test that kills a server is in test_replica_killed.py, on a server of its own.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

import pytest
import structlog

from bot.engine.base import BACKGROUND_PRIORITY, GenerationRequest
from bot.engine.openai_remote import OpenAIRemoteEngine
from bot.engine.routing import rendezvous_order
from bot.engine.vllm_local import LocalVLLMEngine
from bot.errors import EngineError, ErrorClass
from bot.ops.recent_answer import FRESH_S
from bot.testing.vllm_servers import VLLMServer, free_port
from bot.turns.chat_format import ChatFormat
from tests.conftest import TEST_BLOCK_SIZE, MakeClient, issue_key
from tests.helpers import auth, read_sse
from tests.remote.conftest import collect, engine_for, request
from tests.remote.misbehaving import MisbehavingServer


async def failure_of(engine: OpenAIRemoteEngine, req: GenerationRequest) -> EngineError:
    with pytest.raises(EngineError) as caught:
        await collect(engine, req)
    return caught.value


# -- the happy path ------------------------------------------------------------------------


async def test_remote_ids_are_the_local_engines_and_the_cache_is_reported(
    remote_engine: OpenAIRemoteEngine, engine: LocalVLLMEngine, chat_format: ChatFormat
) -> None:
    prompt = chat_format.first_turn("Hello there, remote replica!").token_ids
    remote_ids, final = await collect(remote_engine, request(prompt, "chat-exact"))
    local_ids, _ = await collect(engine, request(prompt))
    # Same model, greedy: the ids that crossed the wire are exactly the engine's ids.
    assert remote_ids == local_ids and remote_ids
    assert final.prompt_tokens == len(prompt)
    assert final.finish_reason in {"length", "stop"}
    assert final.timings is not None and final.timings.prefill_ms > 0

    # Turn 2, token-exact: the previous prompt + reply come from the replica's cache.
    second = prompt + remote_ids + chat_format.next_turn(remote_ids, "And then?").token_ids
    _, final2 = await collect(remote_engine, request(second, "chat-exact"))
    cacheable = (len(prompt) + len(remote_ids) - 1) // TEST_BLOCK_SIZE * TEST_BLOCK_SIZE
    assert final2.cached_tokens is not None and final2.cached_tokens >= cacheable > 0


async def test_each_conversation_sticks_to_its_rendezvous_replica(
    remote_engine: OpenAIRemoteEngine, vllm_servers: list[VLLMServer], chat_format: ChatFormat
) -> None:
    by_url = {server.base_url: server for server in vllm_servers}
    before = {url: server.metric("vllm:request_success_total") for url, server in by_url.items()}
    # Ports are random, so which replica owns a key is too: take three keys each replica owns.
    owned: dict[str, list[str]] = {url: [] for url in by_url}
    for i in range(1000):
        key = f"affinity-{i}"
        owner = rendezvous_order(key, list(by_url))[0]
        if len(owned[owner]) < 3:
            owned[owner].append(key)
    keys = [key for url_keys in owned.values() for key in url_keys]
    expected = {url: 0 for url in by_url}
    for key in keys:
        expected[rendezvous_order(key, list(by_url))[0]] += 3
    assert all(expected.values()), "both replicas should own some of these conversations"

    async def chat(key: str) -> list[int]:
        prompt = chat_format.first_turn(f"Conversation {key} starts here.").token_ids
        cached = []
        for turn in range(3):
            ids, final = await collect(remote_engine, request(prompt, key))
            if turn:
                cached.append(final.cached_tokens or 0)
            prompt = prompt + ids + chat_format.next_turn(ids, f"turn {turn}").token_ids
        return cached

    results = await asyncio.gather(*(chat(key) for key in keys))
    after = {url: server.metric("vllm:request_success_total") for url, server in by_url.items()}
    assert {url: after[url] - before[url] for url in by_url} == expected
    assert all(hit >= TEST_BLOCK_SIZE for cached in results for hit in cached), results


async def test_the_turn_pipeline_runs_on_remote_replicas(
    db_url: str, make_client: MakeClient, remote_engine: OpenAIRemoteEngine
) -> None:
    client = await make_client(db_url, engine_override=remote_engine)
    key = await issue_key(db_url)
    usages = []
    for i in range(3):
        response = await client.post(
            "/v1/messages",
            json={"conversation_id": "remote", "message_id": f"m{i}", "text": f"Message {i}"},
            headers={**auth(key), "Accept": "text/event-stream"},
        )
        events = await read_sse(response)
        assert events[-1].kind == "done", events[-1]
        usages.append(events[-1].data["usage"])
    for previous, current in itertools.pairwise(usages):
        cacheable = (
            (previous["prompt_tokens"] + previous["completion_tokens"] - 1)
            // TEST_BLOCK_SIZE
            * TEST_BLOCK_SIZE
        )
        assert current["cached_tokens"] >= cacheable, (previous, current)


async def test_the_session_and_key_travel_as_headers(misbehaving: MisbehavingServer) -> None:
    misbehaving.mode = "no_choices"
    engine = await engine_for([misbehaving.base_url], max_attempts=1)
    try:
        await failure_of(engine, request([1, 2, 3], "conv-42"))
    finally:
        await engine.shutdown()
    sent = misbehaving.requests[0]
    assert sent["prompt"] == [1, 2, 3] and sent["return_token_ids"] is True
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    headers = {name.lower(): value for name, value in misbehaving.headers[0].items()}
    assert headers["x-session-id"] == "conv-42"
    assert headers["authorization"] == "Bearer test-engine-key"


async def test_background_work_carries_its_priority_and_a_first_come_server_serves_it(
    remote_engine: OpenAIRemoteEngine, misbehaving: MisbehavingServer
) -> None:
    """vLLM's default scheduler (first come, first served) accepts a priority and ignores it;
    a server started with ``--scheduling-policy priority`` schedules by it."""
    background = replace(request([1, 2, 3, 4], "conv-7"), priority=BACKGROUND_PRIORITY)
    ids, final = await collect(remote_engine, background)
    assert ids and final.finish_reason is not None

    misbehaving.mode = "no_choices"
    engine = await engine_for([misbehaving.base_url], max_attempts=1)
    try:
        await failure_of(engine, background)
        await failure_of(engine, request([1, 2, 3], "conv-7"))
    finally:
        await engine.shutdown()
    assert misbehaving.requests[0]["priority"] == BACKGROUND_PRIORITY
    assert "priority" not in misbehaving.requests[1]  # a user's: the server's default


# -- each failure, classified, with a hint ----------------------------------------------------


async def test_a_wrong_key_is_auth(vllm_servers: list[VLLMServer]) -> None:
    engine = await engine_for([vllm_servers[0].base_url], api_key="wrong")
    try:
        error = await failure_of(engine, request([1, 2, 3], "k"))
    finally:
        await engine.shutdown()
    assert error.error_class is ErrorClass.AUTH and "api_key" in (error.hint or "")


async def test_an_unknown_model_is_model_not_found_and_names_the_served_ones(
    vllm_servers: list[VLLMServer],
) -> None:
    engine = await engine_for([vllm_servers[0].base_url], served_model_name="gpt-5")
    try:
        error = await failure_of(engine, request([1, 2, 3], "k"))
    finally:
        await engine.shutdown()
    assert error.error_class is ErrorClass.MODEL_NOT_FOUND
    assert "demo" in (error.hint or "")


async def test_connection_refused_and_dns_failures_are_network() -> None:
    for url, hint_word in [
        (f"http://127.0.0.1:{free_port()}", "running"),
        ("http://no-such-replica.invalid:8000", "DNS"),
    ]:
        engine = await engine_for([url], max_attempts=2)
        try:
            error = await failure_of(engine, request([1, 2, 3], "k"))
        finally:
            await engine.shutdown()
        assert error.error_class is ErrorClass.NETWORK, error
        assert hint_word in (error.hint or ""), error.hint


@pytest.mark.parametrize("mode", ["html", "not_json", "no_choices"])
async def test_a_body_that_is_not_the_promised_json_is_upstream_protocol(
    misbehaving: MisbehavingServer, mode: str
) -> None:
    misbehaving.mode = mode
    engine = await engine_for([misbehaving.base_url])
    try:
        error = await failure_of(engine, request([1, 2, 3], "k"))
    finally:
        await engine.shutdown()
    assert error.error_class is ErrorClass.UPSTREAM_PROTOCOL and error.hint
    assert len(misbehaving.requests) == 1, "a protocol error is not retried"


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (429, ErrorClass.RATE_LIMITED),
        (500, ErrorClass.ENGINE_UNAVAILABLE),
        (503, ErrorClass.ENGINE_UNAVAILABLE),
    ],
)
async def test_429_and_5xx_are_retried_a_bounded_number_of_times(
    misbehaving: MisbehavingServer, status: int, error_class: ErrorClass
) -> None:
    misbehaving.mode, misbehaving.status = "status", status
    engine = await engine_for([misbehaving.base_url], max_attempts=3)
    try:
        error = await failure_of(engine, request([1, 2, 3], "k"))
    finally:
        await engine.shutdown()
    assert error.error_class is error_class and error.hint
    assert len(misbehaving.requests) == 3


async def test_a_silent_server_is_a_timeout(misbehaving: MisbehavingServer) -> None:
    misbehaving.mode = "hang"
    engine = await engine_for([misbehaving.base_url], request_timeout_s=0.5, max_attempts=1)
    try:
        error = await failure_of(engine, request([1, 2, 3], "k"))
    finally:
        await engine.shutdown()
    assert error.error_class is ErrorClass.TIMEOUT and "request_timeout_s" in (error.hint or "")


async def test_nothing_is_retried_once_text_has_streamed(misbehaving: MisbehavingServer) -> None:
    misbehaving.mode = "drop_after_first"
    engine = await engine_for([misbehaving.base_url], max_attempts=3)
    received: list[int] = []
    try:
        with pytest.raises(EngineError) as caught:
            async for chunk in engine.generate(request([1, 2, 3], "k")):
                received.extend(chunk.token_ids)
    finally:
        await engine.shutdown()
    assert received == [5]
    assert caught.value.error_class is ErrorClass.ENGINE_UNAVAILABLE
    assert len(misbehaving.requests) == 1, "a retry would repeat text the user already saw"


async def test_the_environment_s_proxy_carries_the_requests_to_the_replicas(
    misbehaving: MisbehavingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP(S)_PROXY and NO_PROXY apply to the engine's replicas as to any client on the host."""
    # The fake server plays the proxy: a replica whose name does not resolve is reached
    # only through it.
    monkeypatch.setenv("HTTP_PROXY", misbehaving.base_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    misbehaving.mode = "ok"
    engine = await engine_for(["http://replica.invalid:8000"], max_attempts=1)
    try:
        ids, final = await collect(engine, request([1, 2, 3], "k"))
    finally:
        await engine.shutdown()
    assert ids == [5] and final.finished
    assert len(misbehaving.requests) == 1

    # NO_PROXY names the replica: it is dialled directly (and does not resolve).
    monkeypatch.setenv("NO_PROXY", "replica.invalid")
    engine = await engine_for(["http://replica.invalid:8000"], max_attempts=1)
    try:
        error = await failure_of(engine, request([1, 2, 3], "k"))
    finally:
        await engine.shutdown()
    assert error.error_class is ErrorClass.NETWORK
    assert len(misbehaving.requests) == 1


async def test_a_replica_streaming_to_us_is_healthy_though_its_health_check_fails(
    misbehaving: MisbehavingServer,
) -> None:
    """Under load a replica's /health can miss the check's timeout while every stream flows:
    a stream that just delivered is the better evidence (bot.ops.recent_answer)."""
    misbehaving.mode = "slow"  # and /health answers 404
    engine = await engine_for([misbehaving.base_url], max_attempts=1)
    try:
        with pytest.raises(EngineError):
            await engine.check_health()  # idle: the check's own round trip decides
        stream = engine.generate(request([1, 2, 3], "k"))
        first_token = asyncio.ensure_future(anext(stream))
        while True:  # healthy once the stream has opened, before its first token
            try:
                await engine.check_health()
                break
            except EngineError:
                assert not first_token.done(), "the first token came before any healthy check"
                await asyncio.sleep(0.05)
        assert not first_token.done()
        first = await first_token
        assert list(first.token_ids) == [5]
        await engine.check_health()  # mid-stream: healthy without asking
        rest = [chunk async for chunk in stream]
        assert rest[-1].finished
        await asyncio.sleep(FRESH_S + 0.1)
        with pytest.raises(EngineError):
            await engine.check_health()  # nothing since: asked again, and it fails
    finally:
        await engine.shutdown()


async def test_a_failing_replica_fails_over_and_its_breaker_opens(
    misbehaving: MisbehavingServer, vllm_servers: list[VLLMServer]
) -> None:
    misbehaving.mode, misbehaving.status = "status", 502
    urls = [misbehaving.base_url, vllm_servers[1].base_url]
    engine = await engine_for(urls, breaker_failures=2, breaker_cooldown_s=60)
    keys = [
        key for key in (f"conv-{i}" for i in range(50)) if rendezvous_order(key, urls)[0] == urls[0]
    ]
    try:
        with structlog.testing.capture_logs() as logs:
            for key in keys[:4]:
                ids, final = await collect(engine, request([1, 2, 3, 4], key, max_tokens=4))
                assert ids and final.finished
    finally:
        await engine.shutdown()
    # Two failures opened the breaker; later turns go straight to the healthy replica.
    assert len(misbehaving.requests) == 2
    assert engine.replicas.breakers[urls[0]].state == "open"
    failed = [entry for entry in logs if entry["event"] == "engine_attempt_failed"]
    assert {entry["error_class"] for entry in failed} == {"engine_unavailable"}
