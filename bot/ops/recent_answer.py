"""When a dependency last did real work for this process: evidence for readiness.

Under load, a readiness check's own round trip to the database or to an engine
replica waits behind the very work that shows the dependency is up: on a
2-core machine with 150 replies streaming and vLLM's threads on both cores,
single checks took over 3 s (the check's timeout) while every turn succeeded,
and ``/readyz`` said 503. A load balancer then takes a worker out of rotation
for being busy, which moves its load onto the others. A dependency that
answered real work within ``FRESH_S`` is up; an idle one gets the round trip.
"""

from __future__ import annotations

import math
import time

FRESH_S = 1.0
"""How long an answer counts: a dependency that stops answering is reported after
at most this long (a load balancer probes every few seconds)."""


class RecentAnswer:
    """The monotonic time of a dependency's last good answer."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at = -math.inf

    def saw(self) -> None:
        self._at = time.monotonic()

    def fresh(self, within_s: float = FRESH_S) -> bool:
        return time.monotonic() - self._at <= within_s
