"""JSON error responses: every refusal says why, in a machine-readable way."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def json_error(status: int, error: str, reason: str, **extra: Any) -> web.Response:
    return web.json_response({"error": error, "reason": reason, **extra}, status=status)
