"""Failover when a real replica is SIGKILLed (zz_: later tests would have one server fewer)."""

from __future__ import annotations

from bot.engine.routing import rendezvous_order
from bot.turns.chat_format import ChatFormat
from tests.conftest import TEST_BLOCK_SIZE
from tests.remote.test_openai_remote import collect, engine_for, request
from tests.vllm_servers import VLLMServer


async def test_a_killed_replica_fails_over_to_the_next_in_the_ranking(
    vllm_servers: list[VLLMServer], chat_format: ChatFormat
) -> None:
    urls = [server.base_url for server in vllm_servers]
    engine = await engine_for(urls, breaker_failures=1)
    victim = vllm_servers[0]
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
