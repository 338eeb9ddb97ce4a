"""/openapi.json is true: every route is in it, and schemathesis finds no 5xx or stray status.

Schemathesis generates requests from the served document and sends them with
``requests`` from a worker thread to the live app on loopback, whose event
loop stays free to answer (``tests.security.fuzzing``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    status_code_conformance,
)

from bot.http.keys import TURNS
from bot.http.openapi import document, documented_paths, routed_paths
from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram
from tests.conftest import MakeClient, issue_key
from tests.discord.conftest import discord_section
from tests.helpers import auth
from tests.slack.conftest import slack_section
from tests.telegram.conftest import bot_table
from tests.webhook.conftest import Receiver, webhook_settings

MAX_EXAMPLES = 80


async def test_every_route_is_documented_and_nothing_else(
    sqlite_url: str,
    make_client: MakeClient,
    fake_telegram: FakeTelegram,
    slack_api: FakeSlackApi,
    receiver: Receiver,
) -> None:
    everything = await make_client(
        sqlite_url,
        telegram=[bot_table(fake_telegram)],
        slack=slack_section(slack_api.base_url),
        webhooks=webhook_settings(receiver),
        discord=discord_section("http://127.0.0.1:9/api/v10"),
    )
    assert routed_paths(everything.app) == documented_paths()
    served = await (await everything.get("/openapi.json")).json()
    assert served == document(everything.app)

    api_only = await make_client(sqlite_url)
    paths = (await (await api_only.get("/openapi.json")).json())["paths"]
    assert "/v1/messages" in paths
    # Slack, Discord and webhook routes exist only when configured (Telegram's always).
    assert not any(path.startswith(("/slack", "/discord", "/webhooks")) for path in paths)


def run_schemathesis(spec: dict[str, Any], base_url: str, headers: dict[str, str]) -> int:
    """Schemathesis over every operation of ``spec``; returns how many cases it sent."""
    schema = schemathesis.openapi.from_dict(spec)
    sent = 0

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=schema.as_strategy(GenerationMode.POSITIVE)
        | schema.as_strategy(GenerationMode.NEGATIVE)
    )
    def each(case: Any) -> None:
        nonlocal sent
        sent += 1
        case.call_and_validate(
            base_url=base_url,
            headers=headers,
            checks=[not_a_server_error, status_code_conformance, content_type_conformance],
            timeout=30,
        )

    each()
    return sent


async def test_schemathesis_finds_nothing_on_the_live_app(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    spec = await (await client.get("/openapi.json")).json()
    base_url = str(client.make_url("")).rstrip("/")
    sent = await asyncio.to_thread(run_schemathesis, spec, base_url, auth(key))
    assert sent >= MAX_EXAMPLES // 2
    await client.app[TURNS].wait_idle(timeout=120)
