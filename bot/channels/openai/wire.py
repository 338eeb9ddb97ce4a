"""Server-Sent Events the way OpenAI's APIs send them.

Chat completions send bare ``data:`` lines and end with ``data: [DONE]``; the
Responses API names each event (``event: response.output_text.delta``) and
repeats the name as ``type`` in the data.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

DONE_LINE = b"data: [DONE]\n\n"


def data_line(payload: dict[str, Any], event: str | None = None) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {data}\n\n".encode()


async def write(
    response: web.StreamResponse, payload: dict[str, Any], event: str | None = None
) -> None:
    await response.write(data_line(payload, event))
