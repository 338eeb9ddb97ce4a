"""Slack test helpers: the fake Web API on loopback and channels wired to it."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from slack_sdk.signature import SignatureVerifier

from bot.channels.slack.channel import SlackChannel
from bot.channels.slack.settings import SlackAppSettings
from bot.http.keys import TURNS
from bot.testing.slack_api import FakeSlackApi

FIXTURES = Path(__file__).parent / "fixtures"
TOKEN = "xoxb-test-0001"
TEAM = "T0001TEAM"
APP_ID = "A0001APP"
BOT_USER = "UBOT0001"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return copy.deepcopy(data)


@pytest.fixture
async def slack_api() -> AsyncIterator[FakeSlackApi]:
    fake = FakeSlackApi()
    fake.add_workspace(TOKEN, TEAM, bot_user_id=BOT_USER)
    fake.add_user(TEAM, "U0001ALICE", display_name="Alice", real_name="Alice Liddell")
    fake.add_user(TEAM, "U0002BOB", display_name="Bob")
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def app_table(base_url: str, **overrides: Any) -> dict[str, Any]:
    """One ``[[slack]]`` table of the test app, pointed at the fake Web API."""
    return {
        "name": "main",
        "signing_secret": SIGNING_SECRET,
        "bot_token": TOKEN,
        "api_base_url": base_url,
        "app_id": APP_ID,
        "stream_interval_s": 0.05,
        "update_interval_s": 0.05,
        "post_interval_s": 0.05,
        **overrides,
    }


def app_settings(base_url: str, **overrides: Any) -> SlackAppSettings:
    return SlackAppSettings(**app_table(base_url, **overrides))


MakeChannel = Callable[..., SlackChannel]


@pytest.fixture
def make_channel(slack_api: FakeSlackApi, http: aiohttp.ClientSession) -> MakeChannel:
    def factory(**overrides: Any) -> SlackChannel:
        return SlackChannel(app_settings(slack_api.base_url, **overrides), http)

    return factory


CHANNEL = "C0001CHAN"
DM = "D0001DM"
THREAD = "1700000001.000100"


def slack_section(base_url: str, **overrides: Any) -> list[dict[str, Any]]:
    return [app_table(base_url, **overrides)]


async def post_event(
    client: TestClient[Any, Any],
    body: dict[str, Any],
    *,
    secret: str = SIGNING_SECRET,
    timestamp: int | None = None,
    retry_num: int | None = None,
    signature: str | None = None,
) -> tuple[int, str, float]:
    raw = json.dumps(body)
    ts = str(int(time.time()) if timestamp is None else timestamp)
    headers = {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature
        or SignatureVerifier(secret).generate_signature(timestamp=ts, body=raw)
        or "",
    }
    if retry_num is not None:
        headers["X-Slack-Retry-Num"] = str(retry_num)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    started = time.perf_counter()
    response = await client.post("/slack/events", data=raw, headers=headers)
    text = await response.text()
    return response.status, text, time.perf_counter() - started


async def idle(client: TestClient[Any, Any]) -> None:
    await client.server.app[TURNS].wait_idle(timeout=120)


def mention(
    event_id: str, ts: str, *, thread_ts: str | None = None, user: str = "U0001ALICE"
) -> dict[str, Any]:
    body = load_fixture("app_mention")
    body["event_id"] = event_id
    body["event"].update(ts=ts, event_ts=ts, user=user)
    if thread_ts:
        body["event"]["thread_ts"] = thread_ts
    return body


COMMAND_FIXTURE = FIXTURES / "slash_command_new_in_dm.txt"
FORM = "application/x-www-form-urlencoded"
DM_KEY = f"im:{DM}"


def command_form(command: str = "/new", **fields: str) -> dict[str, str]:
    """The fixture's fields (a ``/new`` in the DM) with ``command`` and ``fields`` changed."""
    form = dict(parse_qsl(COMMAND_FIXTURE.read_text().strip(), keep_blank_values=True))
    return {**form, "command": command, **fields}


def in_channel(command: str) -> dict[str, str]:
    return command_form(command, channel_id=CHANNEL, channel_name="general")


async def post_command(
    client: TestClient[Any, Any],
    form: dict[str, str] | str,
    *,
    secret: str = SIGNING_SECRET,
    timestamp: int | None = None,
    signature: str | None = None,
    content_type: str = FORM,
) -> tuple[int, dict[str, Any]]:
    raw = form if isinstance(form, str) else urlencode(form)
    ts = str(int(time.time()) if timestamp is None else timestamp)
    headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": ts}
    headers["X-Slack-Signature"] = (
        signature or SignatureVerifier(secret).generate_signature(timestamp=ts, body=raw) or ""
    )
    response = await client.post("/slack/commands", data=raw, headers=headers)
    document: dict[str, Any] = await response.json()
    return response.status, document


def ephemeral(text: str) -> dict[str, Any]:
    return {"response_type": "ephemeral", "text": text}


def dm_message(event_id: str, ts: str, text: str) -> dict[str, Any]:
    body = load_fixture("message_im")
    body["event_id"] = event_id
    body["event"].update(ts=ts, event_ts=ts, text=text)
    return body
