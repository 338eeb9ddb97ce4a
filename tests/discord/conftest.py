"""Discord test helpers: a real Ed25519 key pair, the fake HTTP API and gateway, signed posts.

The application's key pair is made here with ``cryptography``; requests are
signed with its private key exactly as Discord signs them (Ed25519 over the
timestamp followed by the raw body), and the service verifies them with the
public key from its ``[[discord]]`` table.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bot.http.keys import TURNS
from bot.testing.discord_api import FakeDiscordApi
from bot.testing.discord_gateway import FakeDiscordGateway

FIXTURES = Path(__file__).parent / "fixtures"
APPLICATION_ID = "1198765432109876543"
BOT_USER_ID = "1198765432109876000"
TOKEN = "MTE5ODc2NTQzMjEwOTg3NjAwMA.GfakeX.test-bot-token-not-real"
SIGNING_KEY = Ed25519PrivateKey.generate()
PUBLIC_KEY = SIGNING_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
GUILD_CHANNEL = "1110000000000000001"
DM_CHANNEL = "1120000000000000001"
ALICE = "300000000000000001"
BOB = "300000000000000002"


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return copy.deepcopy(data)


@pytest.fixture
async def discord_api() -> AsyncIterator[FakeDiscordApi]:
    fake = FakeDiscordApi(
        token=TOKEN,
        application_id=APPLICATION_ID,
        public_key=PUBLIC_KEY,
        bot_user_id=BOT_USER_ID,
    )
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def discord_gateway(discord_api: FakeDiscordApi) -> AsyncIterator[FakeDiscordGateway]:
    gateway = FakeDiscordGateway(
        token=TOKEN, bot_user_id=BOT_USER_ID, application_id=APPLICATION_ID
    )
    await gateway.start()
    discord_api.gateway_url = gateway.url
    yield gateway
    await gateway.close()


def bot_table(base_url: str, **overrides: Any) -> dict[str, Any]:
    """One ``[[discord]]`` table of the test bot, pointed at the fake API."""
    return {
        "name": "main",
        "application_id": APPLICATION_ID,
        "public_key": PUBLIC_KEY,
        "token": TOKEN,
        "api_base_url": base_url,
        "edit_interval_s": 0.05,
        "post_interval_s": 0.05,
        **overrides,
    }


def discord_section(base_url: str, **overrides: Any) -> list[dict[str, Any]]:
    return [bot_table(base_url, **overrides)]


def sign(body: bytes, timestamp: str) -> str:
    return SIGNING_KEY.sign(timestamp.encode() + body).hex()


async def post_signed(
    client: TestClient[Any, Any],
    raw: bytes,
    *,
    timestamp: int | None = None,
    signature: str | None = None,
    path: str = "/discord/main",
) -> tuple[int, Any, float]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    headers = {
        "Content-Type": "application/json",
        "X-Signature-Timestamp": ts,
        "X-Signature-Ed25519": signature if signature is not None else sign(raw, ts),
    }
    started = time.perf_counter()
    response = await client.post(path, data=raw, headers=headers)
    elapsed = time.perf_counter() - started
    try:
        document = await response.json(content_type=None)
    except ValueError:
        document = None
    return response.status, document, elapsed


async def interact(
    client: TestClient[Any, Any], fake: FakeDiscordApi, body: dict[str, Any]
) -> tuple[int, Any, float]:
    """Post a signed interaction as Discord does; once answered, Discord knows its webhook."""
    status, document, elapsed = await post_signed(client, json.dumps(body).encode())
    if status == 200 and isinstance(document, dict) and document.get("type") in (4, 5):
        fake.acknowledge(body["token"], body["channel_id"], document)
    return status, document, elapsed


def ask(
    interaction_id: str,
    text: str,
    *,
    dm: bool = False,
    channel_id: str | None = None,
    user_id: str | None = None,
) -> dict[str, Any]:
    """``/ask message:text`` in the fixture's server channel (or DM), with its own id and token."""
    body = load_fixture("ask_in_dm" if dm else "ask_in_guild")
    body["id"] = interaction_id
    body["token"] = f"token-{interaction_id}-" + "x" * 40
    body["data"]["options"][0]["value"] = text
    if channel_id is not None:
        body["channel_id"] = channel_id
        body["channel"]["id"] = channel_id
    if user_id is not None:
        (body["user"] if dm else body["member"]["user"])["id"] = user_id
    return body


def command(interaction_id: str, name: str, *, dm: bool = False, **options: str) -> dict[str, Any]:
    body = ask(interaction_id, "unused", dm=dm)
    body["data"]["name"] = name
    body["data"]["options"] = [{"name": k, "type": 3, "value": v} for k, v in options.items()]
    if not options:
        del body["data"]["options"]
    return body


async def idle(client: TestClient[Any, Any]) -> None:
    await client.server.app[TURNS].wait_idle(timeout=120)
