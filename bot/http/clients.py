"""The outbound HTTP client of the platforms: Telegram, Slack and webhook callbacks.

Its own connection pool, never the engine's (``bot.engine.openai_remote``
keeps its own): a slow platform or callback receiver cannot hold connections
a turn needs to generate, and a burst of generations cannot delay deliveries.
aiohttp's default pool of 100 connections would make the 101st concurrent
delivery wait, and that wait counts against each call's ``total`` timeout.
"""

from __future__ import annotations

import aiohttp

PLATFORM_MAX_CONNECTIONS = 1024
"""Connections to the platforms at once (deliveries, callbacks); a few per running turn at most."""
PLATFORM_TIMEOUT_S = 30.0
"""Default bound of a platform call; clients pass their own per call (``api_timeout_s`` ...)."""


def platform_client() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=PLATFORM_TIMEOUT_S),
        connector=aiohttp.TCPConnector(limit=PLATFORM_MAX_CONNECTIONS, limit_per_host=0),
    )
