"""Every platform id, at any length or shape, gets a 400 or an ignored update: never a 5xx.

Hypothesis puts one drawn value in one id of a real payload (Telegram's update,
chat, user, message and topic ids and a sender's names; Slack's event, team,
channel, user and timestamp ids, in events and slash commands; the webhook's
and the HTTP API's conversation, message and user ids, and the API's ids in
paths) and sends it to the live app, on SQLite and on PostgreSQL, where a value
longer than its column is an error (a 4,000-digit ``update_id`` was a 500).
Each answer must be a status the route documents, a refusal must store nothing,
and a Telegram update with an id Telegram never makes is acknowledged and
ignored: nothing stored either.
"""

from __future__ import annotations

import copy
import json
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
from tests.security.fuzzing import Ingress, documented_statuses, fuzz
from tests.security.test_fuzz_ingress import slack_signature
from tests.slack.conftest import slack_section
from tests.telegram.conftest import SECRET as TELEGRAM_SECRET
from tests.telegram.conftest import bot_table
from tests.webhook.conftest import SECRET as WEBHOOK_SECRET
from tests.webhook.conftest import Receiver, webhook_settings

FIXTURES = Path(__file__).parent.parent
EXAMPLES = 40

LONG_NUMBERS = st.sampled_from(
    [10**3999, -(10**3999), 2**63, -(2**63) - 1, 2**63 - 1, -(2**63), 10**30]
)
NUMBERS = st.integers(min_value=-(2**70), max_value=2**70) | LONG_NUMBERS
LONG_TEXTS = st.sampled_from(
    ["x" * 201, "x" * 401, "7" * 4000, "Ж" * 300, "T" * 65, "U0" + "A" * 70, "1" * 5000]
)
TEXTS = st.text(max_size=40) | st.text(min_size=190, max_size=260) | LONG_TEXTS
ANY_ID = NUMBERS | TEXTS | st.sampled_from([None, True, 1.5, [], {}])


def _fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / name).read_text(encoding="utf-8")))


TELEGRAM_UPDATES = {
    name: _fixture(f"telegram/fixtures/{name}.json")
    for name in ("private_text", "group_mention", "forum_topic_mention", "group_anonymous_admin")
}
TELEGRAM_IDS: list[tuple[str, ...]] = [
    ("update_id",),
    ("message", "chat", "id"),
    ("message", "from", "id"),
    ("message", "message_id"),
    ("message", "message_thread_id"),
    ("message", "from", "first_name"),
    ("message", "from", "last_name"),
    ("message", "sender_chat", "title"),
]
SLACK_EVENTS = {
    name: _fixture(f"slack/fixtures/{name}.json") for name in ("message_im", "app_mention")
}
SLACK_IDS: list[tuple[str, ...]] = [
    ("event_id",),
    ("team_id",),
    ("event", "user"),
    ("event", "channel"),
    ("event", "ts"),
    ("event", "thread_ts"),
]
SLACK_COMMAND = dict(
    parse_qsl((FIXTURES / "slack/fixtures/slash_command_new_in_dm.txt").read_text().strip())
)
POSTED = {"conversation_id": "ids", "message_id": "m1", "text": "Hello", "user_id": "u1"}


def _telegram_id_ok(value: Any) -> bool:
    """The Bot API's ids are integers of at most 64 bits."""
    return type(value) is int and -(2**63) <= value < 2**63


def _with(document: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    parent = changed
    for key in path[:-1]:
        parent = parent.setdefault(key, {})
    parent[path[-1]] = value
    return changed


@pytest.fixture
async def ingress(
    db_url: str,
    make_client: MakeClient,
    fake_telegram: FakeTelegram,
    slack_api: FakeSlackApi,
    receiver: Receiver,
) -> AsyncIterator[Ingress]:
    client = await make_client(
        db_url,
        telegram=[bot_table(fake_telegram, groups="all")],
        slack=slack_section(slack_api.base_url),
        webhooks=webhook_settings(receiver),
    )
    async with aiohttp.ClientSession() as http:
        yield Ingress(
            str(client.make_url("")).rstrip("/"), db_url, http, documented_statuses(client.app)
        )
    await client.app[TURNS].wait_idle(timeout=120)


async def test_telegram_ids(ingress: Ingress) -> None:
    headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    numeric = {path for path in TELEGRAM_IDS if path[-1] in ("id", "update_id", "message_id")}
    numeric.add(("message", "message_thread_id"))

    async def check(example: tuple[str, tuple[str, ...], Any]) -> None:
        name, path, value = example
        update = _with(TELEGRAM_UPDATES[name], path, value)
        if path[-1] == "message_thread_id":
            update["message"]["is_topic_message"] = True
        before = await ingress.accepted_rows()
        status, _ = await ingress.send(
            "POST", "/telegram/testbot", "/telegram/{bot_name}",
            body=json.dumps(update).encode(), headers=headers,
        )  # fmt: skip
        if path == ("update_id",):
            assert (status == 400) != _telegram_id_ok(value), (value, status)
        elif path in numeric and not _telegram_id_ok(value):
            assert status == 200, status  # acknowledged, so Telegram does not redeliver it
            assert await ingress.accepted_rows() == before, "an update Telegram never sends"

    await fuzz(
        st.tuples(st.sampled_from(sorted(TELEGRAM_UPDATES)), st.sampled_from(TELEGRAM_IDS), ANY_ID),
        check,
        EXAMPLES,
    )


async def test_slack_event_ids(ingress: Ingress) -> None:
    async def check(example: tuple[str, tuple[str, ...], Any]) -> None:
        name, path, value = example
        body = json.dumps(_with(SLACK_EVENTS[name], path, value)).encode()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": slack_signature(timestamp, body),
        }
        await ingress.send("POST", "/slack/events", "/slack/events", body=body, headers=headers)

    await fuzz(
        st.tuples(st.sampled_from(sorted(SLACK_EVENTS)), st.sampled_from(SLACK_IDS), ANY_ID),
        check,
        EXAMPLES,
    )


async def test_slack_command_ids(ingress: Ingress) -> None:
    async def check(example: tuple[str, str]) -> None:
        field, value = example
        body = urlencode({**SLACK_COMMAND, field: value}).encode()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": slack_signature(timestamp, body),
        }
        status, _ = await ingress.send(
            "POST", "/slack/commands", "/slack/commands", body=body, headers=headers
        )
        assert status == 200  # Slack shows any other answer to a command as a bare failure

    await fuzz(
        st.tuples(st.sampled_from(["team_id", "channel_id", "user_id"]), TEXTS), check, EXAMPLES
    )


async def test_webhook_ids(ingress: Ingress) -> None:
    async def check(example: tuple[str, Any]) -> None:
        field, value = example
        body = json.dumps({**POSTED, "user_name": "Alice", field: value}).encode()
        headers = {"Content-Type": "application/json", **signed_headers(WEBHOOK_SECRET, body)}
        await ingress.send("POST", "/webhooks/crm", "/webhooks/{name}", body=body, headers=headers)

    fields = st.sampled_from(["conversation_id", "message_id", "user_id", "user_name"])
    await fuzz(st.tuples(fields, ANY_ID), check, EXAMPLES)


async def test_api_ids(ingress: Ingress) -> None:
    key = auth(await issue_key(ingress.db_url))
    routes = [
        ("GET", "/v1/turns/{turn_id}"),
        ("GET", "/v1/turns/{turn_id}/events"),
        ("POST", "/v1/turns/{turn_id}/cancel"),
        ("POST", "/v1/turns/{turn_id}/regenerate"),
        ("GET", "/v1/conversations/{conversation_id}/turns"),
    ]

    async def check(example: tuple[str, Any, tuple[str, str], str]) -> None:
        field, value, (method, route), path_id = example
        body = json.dumps({**POSTED, field: value}).encode()
        await ingress.send(
            "POST", "/v1/messages", "/v1/messages",
            body=body, headers={**key, "Content-Type": "application/json"},
        )  # fmt: skip
        path = route.replace("{turn_id}", quote(path_id, safe="")).replace(
            "{conversation_id}", quote(path_id, safe="")
        )
        await ingress.send(method, path, route, headers=key)

    fields = st.sampled_from(["conversation_id", "message_id", "user_id"])
    path_ids = st.text(min_size=1, max_size=40) | LONG_TEXTS
    await fuzz(st.tuples(fields, ANY_ID, st.sampled_from(routes), path_ids), check, EXAMPLES)
