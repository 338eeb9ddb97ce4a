"""Hypothesis over the live interactions endpoint: signed or not, no body gets a 5xx.

Mutations of real interaction payloads (and hostile bodies), signed with the
application's key, go to the running app: every answer is a documented status
with a JSON reason when it is a refusal, and nothing is stored unless the
answer is a deferred response (the one answer that means "stored, reply to
follow"). Unsigned ones, with drawn signature headers, are all 401.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import strategies as st

from bot.http.openapi import document
from bot.testing.discord_api import FakeDiscordApi
from tests.conftest import MakeClient
from tests.discord.conftest import discord_section, load_fixture, sign
from tests.security.fuzzing import (
    HEADER_VALUES,
    HOSTILE_BODIES,
    Ingress,
    documented_statuses,
    fuzz,
    mutated,
)

INTERACTIONS = [load_fixture(name) for name in ("ping", "ask_in_guild", "ask_in_dm")]
ROUTE = "/discord/{name}"


@pytest.fixture
async def ingress(
    sqlite_url: str, make_client: MakeClient, discord_api: FakeDiscordApi
) -> AsyncIterator[Ingress]:
    client = await make_client(sqlite_url, discord=discord_section(discord_api.base_url))
    assert ROUTE in document(client.app)["paths"]
    async with aiohttp.ClientSession() as http:
        yield Ingress(
            str(client.make_url("")).rstrip("/"),
            sqlite_url,
            http,
            documented_statuses(client.app),
        )


def bodies() -> st.SearchStrategy[bytes]:
    return mutated(INTERACTIONS).map(lambda d: json.dumps(d).encode()) | HOSTILE_BODIES


async def test_signed_bodies_never_get_a_5xx_and_refusals_store_nothing(
    ingress: Ingress,
) -> None:
    async def check(raw: bytes) -> None:
        before = await ingress.accepted_rows()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Signature-Timestamp": timestamp,
            "X-Signature-Ed25519": sign(raw, timestamp),
        }
        status, payload = await ingress.send(
            "POST", "/discord/main", ROUTE, body=raw, headers=headers
        )
        answer: Any = json.loads(payload) if status == 200 else None
        if not (isinstance(answer, dict) and answer.get("type") == 5):
            assert await ingress.accepted_rows() == before, (status, payload[:300])

    await fuzz(bodies(), check)


async def test_unsigned_bodies_are_all_401(ingress: Ingress) -> None:
    strategy = st.tuples(bodies(), HEADER_VALUES, HEADER_VALUES)

    async def check(example: tuple[bytes, str, str]) -> None:
        raw, timestamp, signature = example
        headers = {"X-Signature-Timestamp": timestamp, "X-Signature-Ed25519": signature}
        status, _ = await ingress.send("POST", "/discord/main", ROUTE, body=raw, headers=headers)
        assert status in (401, 413), status

    await fuzz(strategy, check)
