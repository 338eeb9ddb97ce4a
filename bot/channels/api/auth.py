"""Who is calling the HTTP API: a bearer API key, and the scope every API endpoint needs.

Every ``/v1`` endpoint reads or writes conversations, so each needs the
``chat`` scope: a key with only ``admin`` (made for ``/metrics`` and
operators' tools) is refused with 403, not answered.
"""

from __future__ import annotations

from aiohttp import web

from bot.apikeys import Principal, authenticate
from bot.http.errors import json_error
from bot.http.keys import SHORT_READS

CHAT_SCOPE = "chat"


def bearer_key(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return key.strip()


async def authenticate_chat(request: web.Request) -> Principal | web.Response:
    """The caller, or the refusal to send: 401 without a valid key, 403 without the scope."""
    key = bearer_key(request)
    if key is None:
        return json_error(401, "auth", "missing 'Authorization: Bearer <api key>' header")
    principal = await authenticate(request.app[SHORT_READS], key)
    if principal is None:
        return json_error(401, "auth", "unknown, revoked or expired API key")
    if CHAT_SCOPE not in principal.scopes:
        return json_error(
            403, "forbidden", f"this endpoint needs a key with the {CHAT_SCOPE} scope"
        )
    return principal
