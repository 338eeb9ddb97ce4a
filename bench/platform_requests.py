"""A message as each platform delivers it, built from the channels' real payload fixtures:
Telegram's webhook update with its secret header, Slack's Events API callback signed with
slack_sdk's own signer. The load and the soak send them; the service is configured with
the same identities (``telegram_bot``, ``slack_app``).
"""

from __future__ import annotations

import copy
import json
import time
from functools import cache
from typing import Any

from harness import REPO
from slack_sdk.signature import SignatureVerifier

TELEGRAM_BOT = "benchbot"
TELEGRAM_TOKEN = "7000000001:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
TELEGRAM_USERNAME = "BenchBot"
TELEGRAM_SECRET = "bench-Secret_header"
SLACK_TOKEN = "xoxb-bench-0001"
SLACK_TEAM = "T0001TEAM"
SLACK_APP = "A0001APP"
SLACK_BOT_USER = "UBOT0001"
SLACK_USER = "U0001ALICE"
SLACK_CHANNEL = "C0001BENCH"
SLACK_SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@cache
def fixture(channel: str, name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((REPO / "tests" / channel / "fixtures" / name).read_text())
    return loaded


def telegram_update(update_id: int, chat_id: int, text: str) -> bytes:
    """A private chat's text message (``update_id`` is what Telegram deduplicates on)."""
    update = copy.deepcopy(fixture("telegram", "private_text.json"))
    update["update_id"] = update_id
    message = update["message"]
    message["message_id"] = update_id % 1_000_000
    message["chat"]["id"] = message["from"]["id"] = chat_id
    message.update(text=text, date=int(time.time()))
    return json.dumps(update).encode()


def telegram_headers() -> dict[str, str]:
    return {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}


def slack_mention(event_id: str, ts: str, thread_ts: str | None, text: str) -> bytes:
    """A mention of the bot in ``SLACK_CHANNEL``: a reply in thread ``thread_ts``, or (None)
    the root of a new thread."""
    body = copy.deepcopy(fixture("slack", "app_mention.json"))
    body["event_id"] = event_id
    body["event_time"] = int(time.time())
    event = body["event"]
    event.update(ts=ts, event_ts=ts, channel=SLACK_CHANNEL, user=SLACK_USER)
    event["text"] = f"<@{SLACK_BOT_USER}> {text}"
    event.pop("blocks", None)
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    return json.dumps(body).encode()


def slack_headers(raw: bytes) -> dict[str, str]:
    """Signed now: a retry signs again, as Slack does."""
    now = str(int(time.time()))
    signature = SignatureVerifier(SLACK_SIGNING_SECRET).generate_signature(
        timestamp=now, body=raw.decode()
    )
    return {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": now,
        "X-Slack-Signature": signature or "",
    }


def telegram_bot(api_base_url: str, **overrides: Any) -> dict[str, Any]:
    """The ``[[telegram]]`` entry of the bot these updates are for."""
    return {
        "name": TELEGRAM_BOT,
        "token": TELEGRAM_TOKEN,
        "secret_token": TELEGRAM_SECRET,
        "api_base_url": api_base_url,
        "username": TELEGRAM_USERNAME,
        **overrides,
    }


def slack_app(api_base_url: str, **overrides: Any) -> dict[str, Any]:
    """The ``[[slack]]`` entry of the app these events are for."""
    return {
        "name": "main",
        "signing_secret": SLACK_SIGNING_SECRET,
        "bot_token": SLACK_TOKEN,
        "api_base_url": api_base_url,
        "app_id": SLACK_APP,
        **overrides,
    }
