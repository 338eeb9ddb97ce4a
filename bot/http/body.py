"""Reading request bodies within the configured size limit, with JSON errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from bot.http.errors import json_error
from bot.http.keys import SERVER
from bot.http.settings import DEFAULT_BODY_TIMEOUT_S


class BodyError(Exception):
    """The request body is unusable; ``response`` says why (413 or 400)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


async def read_body(request: web.Request, limit: int) -> bytes:
    """The raw body, refused with 413 when larger than ``limit`` (checked before reading).

    A body that does not arrive within ``server.body_timeout_s`` is a 408, and the
    connection is closed (what is left of the body is never read).
    """
    if request.content_length is not None and request.content_length > limit:
        raise BodyError(
            json_error(413, "too_large", f"body of {request.content_length} bytes exceeds {limit}")
        )
    server = request.config_dict.get(SERVER)
    timeout_s = server.body_timeout_s if server else DEFAULT_BODY_TIMEOUT_S
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyError(json_error(413, "too_large", f"body exceeds {limit} bytes")) from exc
    except TimeoutError:
        response = json_error(
            408, "timeout", f"the request body did not arrive within {timeout_s:g} s"
        )
        response.force_close()
        raise BodyError(response) from None


def load_json(body: bytes) -> Any:
    """The body as JSON, or a 400 that says what is wrong with it.

    Besides syntax, Python's decoder refuses two things a client controls:
    nesting deeper than the interpreter's recursion limit (``RecursionError``)
    and integers of more than ``sys.get_int_max_str_digits()`` digits
    (``ValueError``). Both are the client's fault, never a 500.
    """
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise BodyError(json_error(400, "bad_request", "body is not UTF-8 JSON")) from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise BodyError(
            json_error(400, "bad_request", f"body is not valid JSON ({exc.msg} at {where})")
        ) from None
    except RecursionError:
        raise BodyError(json_error(400, "bad_request", "body nests JSON too deeply")) from None
    except ValueError:
        raise BodyError(
            json_error(400, "bad_request", "body holds a number with too many digits")
        ) from None


def parse_json_object(body: bytes) -> dict[str, Any]:
    document = load_json(body)
    if not isinstance(document, dict):
        raise BodyError(json_error(400, "bad_request", "body must be a JSON object"))
    return document
