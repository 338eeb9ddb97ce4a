"""/metrics carries the process collectors and the in-process vLLM engine's own metrics."""

from __future__ import annotations

import asyncio
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.helpers import admin_key, auth
from tests.ops.helpers import chat, samples

VLLM_WAIT_S = 10.0  # vLLM's stat logger records a step's stats just after its outputs


def total(text: str, name: str) -> float:
    return sum(value for (sample, _), value in samples(text).items() if sample == name)


async def test_metrics_carry_process_and_vllm_metrics_after_a_turn(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    assert (await chat(client, key, "c1", "m0", "Hello there"))["kind"] == "done"
    await client.server.app[TURNS].wait_idle(timeout=30)
    admin = auth(await admin_key(sqlite_url))

    loop = asyncio.get_running_loop()
    deadline = loop.time() + VLLM_WAIT_S
    while True:
        response = await client.get("/metrics", headers=admin)
        assert response.status == 200
        text = await response.text()
        if total(text, "vllm:prefix_cache_queries_total") > 0 or loop.time() > deadline:
            break
        await asyncio.sleep(0.2)

    assert total(text, "vllm:prefix_cache_queries_total") > 0
    assert "vllm:prefix_cache_hits_total" in text
    assert "vllm:kv_cache_usage_perc" in text
    assert "vllm:num_requests_waiting" in text
    assert total(text, "process_resident_memory_bytes") > 0
    assert "python_info" in text
    assert total(text, "bot_turns_total") == 1

    families = Counter(family.name for family in text_string_to_metric_families(text))
    assert [name for name, seen in families.items() if seen > 1] == []
