"""Token-exact history: every prompt extends the previous one id for id, and vLLM reuses its KV."""

from __future__ import annotations

import itertools

import structlog

from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from tests.conftest import TEST_BLOCK_SIZE, MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.helpers import SPEC_LAYERS, auth, load_messages, load_turns, read_sse

USER_MESSAGES = [
    "Hello! How are you today?",
    "Tell me about the weather in Paris.",
    "And in Tokyo?",
    "What about 2026-11-30 at 12:30?",
    "**bold** and `code`, please.",
    "Ünïcödé and émojis 🙂 — café?",
    "Thanks, that is all.",
    "One more: a journey of a thousand miles.",
]


def cacheable(prompt_tokens: int, completion_tokens: int) -> int:
    """Full blocks of the previous prompt + reply whose KV exists (the last token's never does)."""
    return (prompt_tokens + completion_tokens - 1) // TEST_BLOCK_SIZE * TEST_BLOCK_SIZE


async def test_each_prompt_extends_the_previous_and_hits_the_cache(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    spy = RecordingEngine(engine)
    client = await make_client(db_url, engine_override=spy)
    key = await issue_key(db_url)
    for i, text in enumerate(USER_MESSAGES):
        body = await (
            await client.post(
                "/v1/messages",
                json={"conversation_id": "long", "message_id": f"m{i}", "text": text},
                headers=auth(key),
            )
        ).json()
        events = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
        assert events[-1].kind == "done", events[-1]

    calls = spy.calls
    assert len(calls) == len(USER_MESSAGES)
    for previous, current in itertools.pairwise(calls):
        before = list(previous.request.prompt_token_ids) + previous.generated
        prompt = list(current.request.prompt_token_ids)
        assert prompt[: len(before)] == before, (
            "prompt does not start with the previous prompt + reply"
        )
        assert current.final is not None and current.final.cached_tokens is not None
        expected = cacheable(len(previous.request.prompt_token_ids), len(previous.generated))
        assert current.final.cached_tokens >= 0.99 * expected, (
            current.final.cached_tokens,
            expected,
        )

    # The stored history is exactly what the engine saw and produced.
    turns = sorted(await load_turns(db_url), key=lambda turn: turn.seq)
    history = await load_messages(db_url, turns[0].conversation_id)
    stored = [token for _, ids, _ in history for token in ids]
    assert stored == list(calls[-1].request.prompt_token_ids) + calls[-1].generated
    for turn, call in zip(turns, calls, strict=True):
        assert turn.prompt_tokens == len(call.request.prompt_token_ids)
        assert turn.completion_tokens == len(call.generated)
        assert turn.cached_tokens == call.final.cached_tokens if call.final else False


async def test_prompt_over_the_context_window_fails_cleanly(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(
        sqlite_url, server={"max_text_chars": 100_000, "max_body_bytes": 1_000_000}
    )
    key = await issue_key(sqlite_url)
    huge = " ".join(f"word{i}" for i in range(3000))
    with structlog.testing.capture_logs() as logs:
        body = await (
            await client.post(
                "/v1/messages",
                json={"conversation_id": "c", "message_id": "m1", "text": huge},
                headers=auth(key),
            )
        ).json()
        events = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
    assert events[-1].kind == "error"
    assert events[-1].data["error_class"] == "context_overflow"
    assert "too long" in events[-1].data["message"]
    turn_lines = [line for line in logs if line["event"] == "turn"]
    assert turn_lines[-1]["status"] == "failed"
    assert turn_lines[-1]["error_class"] == "context_overflow"

    # Nothing of the failed turn entered the history; the next message is answered.
    body = await (
        await client.post(
            "/v1/messages",
            json={"conversation_id": "c", "message_id": "m2", "text": "short"},
            headers=auth(key),
        )
    ).json()
    events = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
    assert events[-1].kind == "done"
    assert events[-1].data["usage"]["prompt_tokens"] < 100


async def test_turn_log_line_has_every_field(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    with structlog.testing.capture_logs() as logs:
        for i in range(2):
            body = await (
                await client.post(
                    "/v1/messages",
                    json={"conversation_id": "c", "message_id": f"m{i}", "text": "Hi"},
                    headers=auth(key),
                )
            ).json()
            await read_sse(await client.get(body["stream_url"], headers=auth(key)))
        await client.server.app[TURNS].wait_idle(timeout=30)
    lines = [line for line in logs if line["event"] == "turn"]
    assert len(lines) == 2
    line = lines[-1]
    assert line["status"] == "done"
    assert set(line["layer_ms"]) >= set(SPEC_LAYERS)
    assert all(value >= 0 for value in line["layer_ms"].values())
    assert line["layer_ms"]["prefill"] > 0 and line["layer_ms"]["decode"] > 0
    assert line["ttft_ms"] > 0 and line["e2e_ms"] >= line["ttft_ms"]
    assert line["prompt_tokens"] == line["cached_tokens"] + line["new_tokens"]
    assert line["cached_tokens"] > 0
    assert line["completion_tokens"] == 32
    assert line["turn_id"] and line["conversation_id"]
    assert "error_class" not in line
