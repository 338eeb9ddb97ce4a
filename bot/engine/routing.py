"""Which replica serves a conversation: rendezvous hashing plus a circuit breaker per replica.

Rendezvous (highest-random-weight) hashing ranks every replica for a key; the
conversation goes to the first replica of its ranking that is up. Adding or
removing one replica moves only the conversations that ranked it first, and a
replica that comes back gets exactly its old conversations back, so each chat
keeps returning to the replica that holds its KV blocks.

One base URL is the case of a router in front (vLLM's router, production-stack,
llm-d): the service ranks nothing and every try goes to that URL, where the
router picks the replica by the session header. Its breaker still counts
failures, but a lone URL is always tried (``candidates``' last resort), since
there is nowhere else to go.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

DEFAULT_BREAKER_FAILURES = 3
DEFAULT_BREAKER_COOLDOWN_S = 10.0


def _weight(replica: str, key: str) -> bytes:
    # blake2b, not hash(): stable across processes, so every bot worker routes alike.
    return hashlib.blake2b(f"{replica}\x00{key}".encode(), digest_size=8).digest()


def rendezvous_order(key: str, replicas: Sequence[str]) -> list[str]:
    """All replicas, best first, for ``key``; the same for every process and every run."""
    return sorted(replicas, key=lambda replica: _weight(replica, key), reverse=True)


@dataclass
class CircuitBreaker:
    """Stops sending to a replica after ``failures`` failures in a row, for ``cooldown_s``.

    After the cooldown requests are let through again (half-open): the first
    success closes the breaker, a single failure opens it for another cooldown.
    Without a breaker every turn of a conversation whose replica is down would
    pay the connect timeout before failing over.
    """

    failures: int = DEFAULT_BREAKER_FAILURES
    cooldown_s: float = DEFAULT_BREAKER_COOLDOWN_S
    clock: Callable[[], float] = time.monotonic
    _consecutive: int = field(default=0, init=False)
    _opened_at: float | None = field(default=None, init=False)

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self.clock() - self._opened_at >= self.cooldown_s:
            return "half_open"
        return "open"

    def allow(self) -> bool:
        """May a request go to this replica now? (No side effect: asking is free.)"""
        return self.state != "open"

    def record_success(self) -> None:
        self._consecutive = 0
        self._opened_at = None

    def record_failure(self) -> None:
        self._consecutive += 1
        if self._opened_at is not None or self._consecutive >= self.failures:
            self._opened_at = self.clock()


class ReplicaSet:
    """The replicas of one model and their breakers."""

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        breaker_failures: int = DEFAULT_BREAKER_FAILURES,
        breaker_cooldown_s: float = DEFAULT_BREAKER_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not base_urls:
            raise ValueError("at least one replica base URL is needed")
        self.base_urls = [url.rstrip("/") for url in base_urls]
        self.breakers = {
            url: CircuitBreaker(breaker_failures, breaker_cooldown_s, clock)
            for url in self.base_urls
        }

    @property
    def routing(self) -> str:
        """``rendezvous``: the service picks the replica; ``upstream``: one URL, whatever
        serves it (a router, or a lone replica) decides."""
        return "rendezvous" if len(self.base_urls) > 1 else "upstream"

    def order(self, session_key: str | None, request_id: str) -> list[str]:
        """Replicas to try, best first: the conversation's ranking (a request's own when none)."""
        return rendezvous_order(session_key or request_id, self.base_urls)

    def candidates(self, session_key: str | None, request_id: str) -> list[str]:
        """The ranking with replicas whose breaker is open moved to the end.

        They stay in the list as a last resort: when every breaker is open it is
        better to try than to refuse outright.
        """
        ranked = self.order(session_key, request_id)
        allowed = [url for url in ranked if self.breakers[url].allow()]
        return allowed + [url for url in ranked if url not in allowed]
