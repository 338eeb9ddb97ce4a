"""Failover when a real replica is SIGKILLed.

The victim is a server of this test's own: the session's servers stay up for the
other tests, whatever order they run in.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.engine.routing import rendezvous_order
from bot.testing.vllm_servers import VLLMServer, start_servers
from bot.turns.chat_format import ChatFormat
from tests.conftest import TEST_BLOCK_SIZE
from tests.remote.conftest import collect, engine_for, request


async def test_a_killed_replica_fails_over_to_the_next_in_the_ranking(
    vllm_servers: list[VLLMServer], chat_format: ChatFormat, demo_model_dir: Path, tmp_path: Path
) -> None:
    [victim] = await asyncio.to_thread(start_servers, demo_model_dir, tmp_path, 1)
    try:
        urls = [victim.base_url, vllm_servers[0].base_url]
        engine = await engine_for(urls, breaker_failures=1)
        key = next(
            k
            for k in (f"kill-{i}" for i in range(50))
            if rendezvous_order(k, urls)[0] == victim.base_url
        )
        prompt = chat_format.first_turn("Before the crash.").token_ids
        try:
            ids, _ = await collect(engine, request(prompt, key))
            victim.kill()
            follow_up = prompt + ids + chat_format.next_turn(ids, "After the crash.").token_ids
            ids2, final = await collect(engine, request(follow_up, key))
            assert ids2 and final.finished
            assert engine.replicas.breakers[victim.base_url].state == "open"
            # The survivor now owns the conversation: its next turn hits the survivor's cache.
            third = follow_up + ids2 + chat_format.next_turn(ids2, "Still there?").token_ids
            _, final3 = await collect(engine, request(third, key))
            assert (final3.cached_tokens or 0) >= TEST_BLOCK_SIZE
        finally:
            await engine.shutdown()
    finally:
        victim.stop()
