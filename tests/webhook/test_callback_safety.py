"""Callbacks go to the configured URL only: no redirects, and no plain http unless allowed."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from bot.channels.webhook.settings import WebhookSettings
from bot.http.keys import TURNS
from tests.conftest import MakeClient
from tests.helpers import load_turns
from tests.webhook.conftest import NAME, SECRET, message, post_signed


def test_plain_http_callbacks_need_to_be_allowed() -> None:
    with pytest.raises(ValidationError, match="must be https"):
        WebhookSettings(name="crm", secret=SECRET, callback_url="http://crm.example.com/hook")
    allowed = WebhookSettings(
        name="crm", secret=SECRET, callback_url="http://10.0.0.5/hook", allow_http_callback=True
    )
    assert allowed.callback_url.startswith("http://")
    WebhookSettings(name="crm", secret=SECRET, callback_url="https://crm.example.com/hook")


async def test_a_redirecting_receiver_is_not_followed(
    sqlite_url: str, make_client: MakeClient
) -> None:
    followed: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/elsewhere")

    async def elsewhere(request: web.Request) -> web.Response:
        followed.append(await request.text())
        return web.Response()

    receiver = web.Application()
    receiver.router.add_post("/hook", redirect)
    receiver.router.add_post("/elsewhere", elsewhere)
    server = TestServer(receiver, host="127.0.0.1")
    await server.start_server()
    try:
        hook = {
            "name": NAME,
            "secret": SECRET,
            "callback_url": str(server.make_url("/hook")),
            "allow_http_callback": True,
            "retry_for_s": 1.0,
            "retry_backoff_s": 0.05,
        }
        client = await make_client(sqlite_url, webhooks=[hook])
        assert (await post_signed(client, message())).status == 202
        await client.app[TURNS].wait_idle(timeout=60)
    finally:
        await server.close()
    assert followed == []
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "failed"
    assert turn.error_class == "delivery"
