"""Per-layer latency of a turn, in milliseconds, in the order a message passes them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

# The canonical layers of the ``turn`` log line, in order. ``wait`` is time
# spent behind earlier turns of the same conversation (they run strictly in order);
# ``start`` the turn's start (queued -> running), on SQLite mostly its wait for the
# write lock behind other conversations' accepts and final writes; ``compact`` a long
# conversation's switch to a shorter base (``bot.turns.compaction``), 0 in most turns.
# The web page's timing bar names each of them (bot/web/static/timing.js).
LAYERS = (
    "ingress",
    "auth",
    "persist",
    "wait",
    "start",
    "history",
    "tokenize",
    "compact",
    "queue",
    "prefill",
    "decode",
    "deliver",
)


class LayerClock:
    """Accumulates milliseconds per layer; a layer timed twice adds up."""

    def __init__(self, initial: dict[str, float] | None = None) -> None:
        self.layer_ms: dict[str, float] = {layer: 0.0 for layer in LAYERS}
        for layer, value in (initial or {}).items():
            if layer in self.layer_ms:
                self.layer_ms[layer] = float(value)

    @contextmanager
    def measure(self, layer: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(layer, (time.perf_counter() - start) * 1000)

    def add(self, layer: str, ms: float) -> None:
        self.layer_ms[layer] = self.layer_ms.get(layer, 0.0) + ms

    def rounded(self) -> dict[str, float]:
        return {layer: round(value, 3) for layer, value in self.layer_ms.items()}
