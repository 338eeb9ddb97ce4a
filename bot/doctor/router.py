"""Doctor: is an engine URL a router in front of vLLM replicas, and which replicas does it see?

A vLLM server answers ``GET /health`` with an empty 200 and has no worker
list. vLLM's router (``vllm-router``) lists its workers at ``/list_workers``
(``{"urls": [...]}``) and counts the healthy ones at ``/readiness``
(``{"healthy_workers": n, "total_workers": m}``). Another router (production-
stack's, llm-d's gateway) is recognised by a ``/health`` that answers with a
JSON body; its replicas are then its own to report. Every look is best effort:
a failure means "not recognised", never a failed check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass(frozen=True)
class RouterInfo:
    kind: str
    """``vllm-router``, or ``router`` for one that does not list its replicas."""
    replicas: list[str] = field(default_factory=list)
    healthy: int | None = None

    def describe(self) -> str:
        if not self.replicas:
            return f"a {self.kind} in front (it does not list its replicas)"
        healthy = f", {self.healthy} healthy" if self.healthy is not None else ""
        return f"a {self.kind} in front of {len(self.replicas)} replicas{healthy}: " + ", ".join(
            self.replicas
        )


async def _get_json(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Any:
    try:
        async with http.get(url, headers=headers) as response:
            if response.status != 200:
                return None
            raw = await response.read()
    except (aiohttp.ClientError, TimeoutError):
        return None
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return None


async def detect_router(
    http: aiohttp.ClientSession, base_url: str, api_key: str | None
) -> RouterInfo | None:
    """What sits at ``base_url`` if it is a router; None for a plain vLLM server."""
    base = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    workers = await _get_json(http, f"{base}/list_workers", headers)
    if isinstance(workers, dict) and isinstance(workers.get("urls"), list):
        readiness = await _get_json(http, f"{base}/readiness", headers)
        healthy = readiness.get("healthy_workers") if isinstance(readiness, dict) else None
        return RouterInfo(
            "vllm-router",
            [str(url) for url in workers["urls"]],
            healthy if isinstance(healthy, int) else None,
        )
    health = await _get_json(http, f"{base}/health", headers)
    if isinstance(health, dict) and health:
        return RouterInfo("router")
    return None
