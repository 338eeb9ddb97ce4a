"""The remote engine counts its calls by upstream, and the app's /metrics shows them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from bot.engine.routing import rendezvous_order
from bot.ops.metrics import BotMetrics
from bot.testing.vllm_servers import VLLMServer
from bot.turns.chat_format import ChatFormat
from tests.remote.conftest import collect, engine_for, request
from tests.remote.misbehaving import MisbehavingServer


def samples(metrics: BotMetrics, name: str) -> dict[tuple[str, str], float]:
    """(upstream, outcome or kind) -> value of ``name`` in the rendered exposition."""
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                labels = sample.labels
                found[(labels["upstream"], labels.get("outcome") or labels["kind"])] = sample.value
    return found


async def test_calls_are_counted_by_the_upstream_that_answered_them(
    vllm_servers: list[VLLMServer], misbehaving: MisbehavingServer, chat_format: ChatFormat
) -> None:
    good = vllm_servers[0].base_url
    urls = [misbehaving.base_url, good]
    # A conversation that ranks the failing upstream first: it fails there, then over.
    key = next(k for k in (f"up-{i}" for i in range(50)) if rendezvous_order(k, urls)[0] == urls[0])
    engine = await engine_for(urls, breaker_failures=5)
    metrics = BotMetrics()
    metrics.more_registries.append(engine.upstream_metrics.registry)
    try:
        prompt = chat_format.first_turn("Count me by upstream.").token_ids
        ids, first = await collect(engine, request(prompt, key))
        follow = prompt + ids + chat_format.next_turn(ids, "Again.").token_ids
        _, second = await collect(engine, request(follow, key))
    finally:
        await engine.shutdown()
    calls = samples(metrics, "bot_engine_calls_total")
    assert calls == {
        (misbehaving.base_url, "engine_unavailable"): 2.0,
        (good, "ok"): 2.0,
    }, calls
    tokens = samples(metrics, "bot_engine_prompt_tokens_total")
    assert tokens[(good, "prompt")] == (first.prompt_tokens or 0) + (second.prompt_tokens or 0)
    assert tokens[(good, "cached")] == (second.cached_tokens or 0) > 0
