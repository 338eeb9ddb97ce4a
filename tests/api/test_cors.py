"""CORS (``server.cors_origins``) and the favicon, on the real app on loopback.

A browser on another origin first sends a preflight (OPTIONS with
Access-Control-Request-Method), then the request; both are sent here as a
browser sends them, and the answers read as a browser reads them.
"""

from __future__ import annotations

import pytest

from bot.config import ConfigError, load_settings
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, read_sse

ORIGIN = "https://chat.example.com"


def preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type",
    }


async def test_an_allowed_origin_gets_preflight_and_answers_streams_included(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url, server={"cors_origins": [ORIGIN]})
    key = await issue_key(sqlite_url)

    answer = await client.options("/v1/messages", headers=preflight(ORIGIN))
    assert answer.status == 204
    assert answer.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in answer.headers["Access-Control-Allow-Methods"]
    allowed_headers = answer.headers["Access-Control-Allow-Headers"].lower()
    assert "authorization" in allowed_headers and "content-type" in allowed_headers
    assert int(answer.headers["Access-Control-Max-Age"]) > 0

    posted = await client.post(
        "/v1/messages",
        json={"conversation_id": "c1", "message_id": "m1", "text": "Hi"},
        headers={**auth(key), "Origin": ORIGIN, "Accept": "text/event-stream"},
    )
    assert posted.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "Origin" in posted.headers.getall("Vary")
    assert (await read_sse(posted))[-1].kind == "done"  # the stream itself, not only its headers

    refused = await client.get("/v1/turns/nope", headers={"Origin": ORIGIN})
    assert refused.status == 401
    assert refused.headers["Access-Control-Allow-Origin"] == ORIGIN  # the page can read why
    assert "Retry-After" in refused.headers["Access-Control-Expose-Headers"]

    # Another origin gets nothing that lets its page read the answer.
    other = await client.options("/v1/messages", headers=preflight("https://evil.example"))
    assert "Access-Control-Allow-Origin" not in other.headers
    assert other.status == 405
    read = await client.get("/v1/personas", headers={**auth(key), "Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in read.headers

    # A path that does not exist stays a 404, preflight or not.
    assert (await client.options("/nowhere", headers=preflight(ORIGIN))).status == 404


async def test_any_origin_with_a_star(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url, server={"cors_origins": ["*"]})
    answer = await client.options(
        "/v1/chat/completions", headers=preflight("http://localhost:3000")
    )
    assert answer.status == 204 and answer.headers["Access-Control-Allow-Origin"] == "*"


async def test_off_by_default(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    answer = await client.options("/v1/messages", headers=preflight(ORIGIN))
    assert answer.status == 405
    assert "Access-Control-Allow-Origin" not in answer.headers
    page = await client.get("/healthz", headers={"Origin": ORIGIN})
    assert "Access-Control-Allow-Origin" not in page.headers


@pytest.mark.parametrize(
    "origin", ["chat.example.com", "https://chat.example.com/app", "ftp://x", "https://"]
)
def test_an_origin_that_is_not_one_is_refused_at_start_up(origin: str) -> None:
    with pytest.raises(ConfigError, match=r"server\.cors_origins.*is not an origin"):
        load_settings(server={"cors_origins": [origin]})


def test_origins_compare_as_browsers_send_them() -> None:
    settings = load_settings(server={"cors_origins": ["HTTPS://Chat.Example.com/"]})
    assert settings.server.cors_origins == ["https://chat.example.com"]


async def test_the_favicon_is_an_icon(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    icon = await client.get("/favicon.ico")
    assert icon.status == 200
    assert icon.content_type == "image/x-icon"
    body = await icon.read()
    assert body[:4] == b"\x00\x00\x01\x00"  # the ICO header: reserved 0, type 1 (icon)
    assert int.from_bytes(body[4:6], "little") >= 1
    assert "max-age" in icon.headers["Cache-Control"]
