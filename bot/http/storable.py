"""Ids a client sends (in a request's path or body) are refused, before any statement, if
no row can hold them.

U+0000 and lone surrogates (``bot.storage.text``) reach a path as ``%00`` or as
escaped bytes that are not UTF-8; PostgreSQL refuses the first in any statement
and no UTF-8 column holds the second. Text a client sends is made storable where
it enters the turn pipeline (``bot.turns.inbound``); an id is looked up, so a
changed one would name something else: it is refused, 400, in the route's own
error shape (``bot.http.key_gate``).
"""

from __future__ import annotations

from typing import Annotated

from aiohttp import web
from pydantic import AfterValidator, BeforeValidator

from bot.http.key_gate import Refusal, RefusalCode, gate_of, plain_refusal
from bot.storage.text import is_storable, storable

UNSTORABLE_REASON = "must not contain U+0000 or unpaired surrogates"


def _storable_id(value: str) -> str:
    if not is_storable(value):
        raise ValueError(UNSTORABLE_REASON)
    return value


StorableId = Annotated[str, AfterValidator(_storable_id)]
"""An id in a request body: refused (a 400 naming the field) if no row can hold it."""


def _storable_text(value: object) -> object:
    # Before pydantic's own check, which refuses a lone surrogate as "not a string".
    return storable(value) if isinstance(value, str) else value


StorableText = Annotated[str, BeforeValidator(_storable_text)]
"""Text in a request body: made storable (U+FFFD) as it is read."""


def refuse_unstorable_path(request: web.Request) -> web.Response | None:
    """The refusal of a request whose path parameters no row can hold, else None."""
    for name, value in request.match_info.items():
        if not is_storable(value):
            gate = gate_of(request.match_info.handler)
            refuse = gate.refuse if gate is not None else plain_refusal
            return refuse(Refusal(400, RefusalCode.BAD_REQUEST, f"{name}: {UNSTORABLE_REASON}"))
    return None
