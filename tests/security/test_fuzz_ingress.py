"""Hypothesis fuzzes every ingress of the live app with mutations of real payloads and headers.

HTTP API, web page, Telegram, Slack events and commands, generic webhook: no
5xx, only documented statuses, JSON reasons, and nothing stored for a refusal.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import aiohttp
import pytest
from hypothesis import strategies as st

from bot.channels.webhook.signing import signed_headers
from bot.http.keys import TURNS
from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth
from tests.security.fuzzing import (
    HEADER_VALUES,
    HOSTILE_BODIES,
    Ingress,
    documented_statuses,
    fuzz,
    header_mutations,
    mutated,
)
from tests.slack.conftest import SIGNING_SECRET, slack_section
from tests.telegram.conftest import SECRET as TELEGRAM_SECRET
from tests.telegram.conftest import bot_table
from tests.webhook.conftest import SECRET as WEBHOOK_SECRET
from tests.webhook.conftest import Receiver, webhook_settings

TELEGRAM_FIXTURES = Path(__file__).parent.parent / "telegram" / "fixtures"
SLACK_FIXTURES = Path(__file__).parent.parent / "slack" / "fixtures"
TELEGRAM_UPDATES = [
    json.loads(path.read_text()) for path in sorted(TELEGRAM_FIXTURES.glob("*.json"))
]
SLACK_EVENTS = [json.loads(path.read_text()) for path in sorted(SLACK_FIXTURES.glob("*.json"))]
SLACK_COMMAND = dict(
    parse_qsl((SLACK_FIXTURES / "slash_command_new_in_dm.txt").read_text().strip())
)
API_MESSAGE = {"conversation_id": "fuzz", "message_id": "m1", "text": "Hello", "user_id": "u1"}
WEBHOOK_MESSAGE = {**API_MESSAGE, "user_name": "Alice"}
IDS = st.text(max_size=30) | st.sampled_from(["..", "%2F", "a/b", "x" * 300, "Ж" * 80])


def slack_signature(timestamp: str, body: bytes) -> str:
    """Slack's v0 signature over any bytes (slack_sdk's own helper takes text only)."""
    base = f"v0:{timestamp}:".encode() + body
    return "v0=" + hmac.new(SIGNING_SECRET.encode(), base, hashlib.sha256).hexdigest()


def bodies(documents: list[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    as_json = mutated(documents).map(lambda document: json.dumps(document).encode())
    return as_json | HOSTILE_BODIES


@pytest.fixture
async def ingress(
    sqlite_url: str,
    make_client: MakeClient,
    fake_telegram: FakeTelegram,
    slack_api: FakeSlackApi,
    receiver: Receiver,
) -> AsyncIterator[Ingress]:
    client = await make_client(
        sqlite_url,
        telegram=[bot_table(fake_telegram)],
        slack=slack_section(slack_api.base_url),
        webhooks=webhook_settings(receiver),
    )
    async with aiohttp.ClientSession() as http:
        yield Ingress(
            str(client.make_url("")).rstrip("/"),
            sqlite_url,
            http,
            documented_statuses(client.app),
        )
    await client.app[TURNS].wait_idle(timeout=120)


async def test_api_messages(ingress: Ingress) -> None:
    key = auth(await issue_key(ingress.db_url))
    headers = header_mutations(["Content-Type", "Authorization", "Accept", "Content-Encoding"])

    async def check(example: tuple[bytes, dict[str, str]]) -> None:
        body, mutation = example
        await ingress.send(
            "POST", "/v1/messages", "/v1/messages", body=body, headers={**key, **mutation}
        )

    await fuzz(st.tuples(bodies([API_MESSAGE]), headers), check)


async def test_api_reads_and_web_page(ingress: Ingress) -> None:
    key = auth(await issue_key(ingress.db_url))
    routes = [
        ("GET", "/v1/turns/{turn_id}"),
        ("GET", "/v1/turns/{turn_id}/events"),
        ("POST", "/v1/turns/{turn_id}/cancel"),
        ("GET", "/v1/conversations/{conversation_id}/turns"),
        ("GET", "/static/{filename}"),
        ("GET", "/"),
        ("GET", "/readyz"),
        ("GET", "/openapi.json"),
    ]
    headers = header_mutations(["Authorization", "Last-Event-ID", "Accept", "If-None-Match"])

    async def check(example: tuple[tuple[str, str], str, dict[str, str]]) -> None:
        (method, route), value, mutation = example
        path = re.sub(r"\{[a-z_]+\}", quote(value, safe=""), route)
        await ingress.send(method, path, route, headers={**key, **mutation})

    await fuzz(st.tuples(st.sampled_from(routes), IDS, headers), check)


async def test_telegram_updates(ingress: Ingress) -> None:
    headers = header_mutations(["X-Telegram-Bot-Api-Secret-Token", "Content-Type"])
    secret = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}

    async def check(example: tuple[bytes, dict[str, str], str]) -> None:
        body, mutation, bot = example
        route = "/telegram/{bot_name}"
        await ingress.send(
            "POST", f"/telegram/{bot}", route, body=body, headers={**secret, **mutation}
        )

    bots = st.sampled_from(["testbot"]) | st.text(
        st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=8
    )
    await fuzz(st.tuples(bodies(TELEGRAM_UPDATES), headers, bots), check)


async def test_slack_events(ingress: Ingress) -> None:
    headers = header_mutations(["X-Slack-Signature", "X-Slack-Request-Timestamp", "Content-Type"])

    async def check(example: tuple[bytes, dict[str, str]]) -> None:
        body, mutation = example
        timestamp = str(int(time.time()))
        signed = {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": slack_signature(timestamp, body),
        }
        await ingress.send(
            "POST", "/slack/events", "/slack/events", body=body, headers={**signed, **mutation}
        )

    await fuzz(st.tuples(bodies(SLACK_EVENTS), headers), check)


async def test_slack_commands(ingress: Ingress) -> None:
    headers = header_mutations(["X-Slack-Signature", "X-Slack-Request-Timestamp", "Content-Type"])
    forms = st.dictionaries(
        st.sampled_from([*SLACK_COMMAND, "ssl_check", "x"]), HEADER_VALUES, max_size=4
    ).map(lambda changes: urlencode({**SLACK_COMMAND, **changes}).encode())

    async def check(example: tuple[bytes, dict[str, str]]) -> None:
        body, mutation = example
        timestamp = str(int(time.time()))
        signed = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": slack_signature(timestamp, body),
        }
        await ingress.send(
            "POST", "/slack/commands", "/slack/commands", body=body, headers={**signed, **mutation}
        )

    await fuzz(st.tuples(forms | HOSTILE_BODIES, headers), check)


async def test_webhook_messages(ingress: Ingress) -> None:
    headers = header_mutations(["X-Webhook-Timestamp", "X-Webhook-Signature", "Content-Type"])

    async def check(example: tuple[bytes, dict[str, str]]) -> None:
        body, mutation = example
        signed = {"Content-Type": "application/json", **signed_headers(WEBHOOK_SECRET, body)}
        await ingress.send(
            "POST", "/webhooks/crm", "/webhooks/{name}", body=body, headers={**signed, **mutation}
        )

    await fuzz(st.tuples(bodies([WEBHOOK_MESSAGE]), headers), check)
