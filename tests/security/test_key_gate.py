"""One key gate: every route of the app either takes a key with its scope or is listed keyless.

The route table is walked, not a list written here: a route added tomorrow without
the gate fails this test until it is gated or put on ``KEYLESS_ROUTES`` with a reason.
Each gated route is called with no key, an unknown key, a key of the other scope
and a key with the scope's prefix but a wrong secret: 401, 401, 403, 401, each
before the handler runs (nothing stored), with the error code ``auth`` or
``forbidden`` in the route's own error shape.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import ClientResponse

from bot.http.key_gate import KEYLESS_ROUTES, Scope, gate_of
from bot.http.openapi import routed_paths
from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram
from tests.conftest import MakeClient, issue_key
from tests.discord.conftest import discord_section
from tests.helpers import admin_key, assert_nothing_stored, auth
from tests.slack.conftest import slack_section
from tests.telegram.conftest import bot_table
from tests.webhook.conftest import Receiver, webhook_settings

# What a path parameter is filled with: a well-formed id that names nothing.
PATH_VALUE = "0123456789abcdef0123456789abcdef"


def _error_code(body: Any) -> str:
    """``{"error": code}`` (the HTTP API) or ``{"error": {"code": code}}`` (OpenAI's)."""
    error = body["error"]
    return str(error["code"] if isinstance(error, dict) else error)


async def _code(response: ClientResponse, status: int, where: str) -> str:
    assert response.status == status, (where, response.status, await response.text())
    return _error_code(await response.json())


async def test_every_gated_route_refuses_before_its_handler_and_the_rest_are_listed(
    db_url: str,
    make_client: MakeClient,
    fake_telegram: FakeTelegram,
    slack_api: FakeSlackApi,
    receiver: Receiver,
) -> None:
    client = await make_client(
        db_url,
        telegram=[bot_table(fake_telegram)],
        slack=slack_section(slack_api.base_url),
        webhooks=webhook_settings(receiver),
        discord=discord_section("http://127.0.0.1:9/api/v10"),
    )
    keys = {Scope.CHAT: await issue_key(db_url), Scope.ADMIN: await admin_key(db_url)}
    other = {Scope.CHAT: keys[Scope.ADMIN], Scope.ADMIN: keys[Scope.CHAT]}
    gated: list[tuple[str, str]] = []
    scopes: set[Scope] = set()
    for route in client.app.router.routes():
        if route.method == "HEAD":
            continue  # aiohttp's twin of each GET
        info = route.resource.get_info() if route.resource is not None else {}
        path = str(info.get("formatter") or info.get("path"))
        gate = gate_of(route.handler)
        if gate is None:
            assert (route.method, path) in KEYLESS_ROUTES, f"{route.method} {path} takes no key"
            continue
        assert (route.method, path) not in KEYLESS_ROUTES, f"{route.method} {path} is gated"
        gated.append((route.method, path))
        scopes.add(gate.scope)
        url = re.sub(r"\{[^}]+\}", PATH_VALUE, path)
        where = f"{route.method} {path}"
        wrong_secret = keys[gate.scope][:-4] + "AAAA"
        attempts: list[tuple[dict[str, str], int, str]] = [
            ({}, 401, "auth"),
            (auth("bot_0123456789ab_unknown"), 401, "auth"),
            (auth(wrong_secret), 401, "auth"),
            (auth(other[gate.scope]), 403, "forbidden"),
        ]
        for headers, status, code in attempts:
            # A body that the handler would take: the gate must refuse before reading it.
            response = await client.request(
                route.method,
                url,
                headers=headers,
                json={"model": "demo-model", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert await _code(response, status, where) == code, where
    # Both scopes are in use, and every keyless entry names a route of this app.
    assert scopes == set(Scope)
    routed = {(method.upper(), path) for method, path in routed_paths(client.app)}
    assert set(KEYLESS_ROUTES) <= routed
    assert ("POST", "/v1/chat/completions") in gated and ("POST", "/v1/messages") in gated
    await assert_nothing_stored(db_url)


async def test_an_admin_only_key_gets_403_from_every_chat_route(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    admin = auth(await admin_key(sqlite_url))
    chat_routes = [
        route
        for route in client.app.router.routes()
        if route.method != "HEAD"
        and (gate := gate_of(route.handler)) is not None
        and gate.scope == Scope.CHAT
    ]
    assert len(chat_routes) >= 15
    for route in chat_routes:
        info = route.resource.get_info() if route.resource is not None else {}
        url = re.sub(r"\{[^}]+\}", PATH_VALUE, str(info.get("formatter") or info.get("path")))
        response = await client.request(route.method, url, headers=admin)
        assert await _code(response, 403, url) == "forbidden"
    # The OpenAI routes answer in OpenAI's shape, which the SDKs read.
    response = await client.post("/v1/chat/completions", headers=admin, json={})
    error = (await response.json())["error"]
    assert error["type"] == "permission_error" and error["code"] == "forbidden"
    await assert_nothing_stored(sqlite_url)
