"""Prometheus metrics of the service, fed by the turn runner's canonical ``turn`` lines.

One ``BotMetrics`` per application, with its own registry (several apps live
in one test process; the global registry would mix them). ``/metrics`` renders
that registry followed by prometheus_client's global one, which holds what
belongs to the whole process: the process and platform collectors
(``process_*``, ``python_*``) and, with the engine in-process, vLLM's own
``vllm:*`` metrics (vLLM's stat logger registers them there). The two hold
disjoint names: ours all start with ``bot_``. The runner calls
``observe_turn`` with the fields of each ``turn`` line, so the metrics and the
log always agree. Platform 429s reach the metrics through
``note_rate_limited``, which channel clients call without knowing about apps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Seconds. Layers span ~0.1 ms (tokenize) to minutes (a long decode, a slow platform).
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0,
)  # fmt: skip
TOKEN_KINDS = ("prompt", "cached", "new", "completion")

_rate_limit_listeners: list[Callable[[str], None]] = []


def note_rate_limited(platform: str) -> None:
    """A platform answered 429 (or its equivalent): count it in every live app's metrics."""
    for listener in list(_rate_limit_listeners):
        listener(platform)


def platform_of(channel: str) -> str:
    """``telegram:support`` -> ``telegram``."""
    return channel.split(":", 1)[0] or "unknown"


class BotMetrics:
    def __init__(
        self,
        in_flight: Callable[[], float] | None = None,
        process_registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.registry = CollectorRegistry()
        self.process_registry = process_registry
        self.more_registries: list[CollectorRegistry] = []
        """Rendered after this app's own: the engine's (``bot_engine_*``, by upstream)."""
        r = self.registry
        self.turns = Counter(
            "bot_turns", "Finished turns.", ["channel", "status", "error_class"], registry=r
        )
        self.layer_seconds = Histogram(
            "bot_turn_layer_seconds",
            "Time a turn spent in each layer (ingress, auth, persist, wait, history, tokenize, "
            "queue, prefill, decode, deliver).",
            ["layer"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft_seconds = Histogram(
            "bot_turn_ttft_seconds",
            "From the message's arrival to the first generated token.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e_seconds = Histogram(
            "bot_turn_e2e_seconds",
            "From the message's arrival to the end of the turn.",
            ["status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "bot_tokens",
            "Tokens by kind: prompt, cached (prompt tokens served from the prefix cache), "
            "new (prompt - cached: recomputed), completion.",
            ["kind"],
            registry=r,
        )
        self.in_flight = Gauge("bot_turns_in_flight", "Turns being generated now.", registry=r)
        if in_flight is not None:
            self.in_flight.set_function(in_flight)
        self.deliveries = Counter(
            "bot_deliveries",
            "Replies per platform: delivered, or failed to deliver.",
            ["platform", "outcome"],
            registry=r,
        )
        self.stream_readers = Gauge(
            "bot_event_streams_open",
            "Event streams (SSE readers) open on this worker now.",
            registry=r,
        )
        self.turn_pollers = Gauge(
            "bot_followed_turn_pollers",
            "Turns whose stored row this worker polls for its readers now (one poller each).",
            registry=r,
        )
        self.rate_limited = Counter(
            "bot_platform_rate_limited",
            "429s (or the platform's equivalent) answered by a messaging platform.",
            ["platform"],
            registry=r,
        )

    def track_streams(self, readers: Callable[[], float], pollers: Callable[[], float]) -> None:
        """Read the open event streams and the turn pollers when scraped."""
        self.stream_readers.set_function(readers)
        self.turn_pollers.set_function(pollers)

    # -- feeding ---------------------------------------------------------------------

    def observe_turn(self, fields: Mapping[str, Any]) -> None:
        """A ``TurnObserver``: called with the fields of every canonical ``turn`` line."""
        channel = str(fields.get("channel") or "unknown")
        status = str(fields.get("status") or "unknown")
        error_class = str(fields.get("error_class") or "")
        self.turns.labels(channel, status, error_class).inc()
        for layer, ms in (fields.get("layer_ms") or {}).items():
            if isinstance(ms, (int, float)):
                self.layer_seconds.labels(layer).observe(ms / 1000)
        ttft = fields.get("ttft_ms")
        if isinstance(ttft, (int, float)):
            self.ttft_seconds.observe(ttft / 1000)
        e2e = fields.get("e2e_ms")
        if isinstance(e2e, (int, float)):
            self.e2e_seconds.labels(status).observe(e2e / 1000)
        for kind in TOKEN_KINDS:
            count = fields.get(f"{kind}_tokens")
            if isinstance(count, int) and count > 0:
                self.tokens.labels(kind).inc(count)
        platform = platform_of(channel)
        if status == "done":
            self.deliveries.labels(platform, "delivered").inc()
        elif error_class == "delivery":
            self.deliveries.labels(platform, "failed").inc()

    def listen_for_rate_limits(self) -> Callable[[], None]:
        """Subscribe to ``note_rate_limited``; returns the unsubscribe function."""

        def listener(platform: str) -> None:
            self.rate_limited.labels(platform).inc()

        _rate_limit_listeners.append(listener)
        return lambda: _rate_limit_listeners.remove(listener)

    def render(self) -> bytes:
        """This app's metrics, its engine's, then the process's (collectors, in-process vLLM)."""
        return (
            generate_latest(self.registry)
            + b"".join(generate_latest(registry) for registry in self.more_registries)
            + generate_latest(self.process_registry)
        )
