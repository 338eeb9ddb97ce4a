"""The fake Bot API itself is strict the way Telegram is (so the other tests mean something)."""

from __future__ import annotations

from typing import Any

import pytest

from bot.channels.telegram.api import TelegramApi, TelegramApiError
from bot.testing.telegram_api import FakeTelegram
from bot.testing.telegram_methods import NOT_MODIFIED
from tests.telegram.conftest import GROUP_CHAT, PRIVATE_CHAT


async def refused(api: TelegramApi, method: str, params: dict[str, Any]) -> TelegramApiError:
    with pytest.raises(TelegramApiError) as raised:
        await api.call(method, params)
    return raised.value


async def test_unknown_method_is_404(api: TelegramApi) -> None:
    error = await refused(api, "sendMesage", {"chat_id": 1, "text": "x"})
    assert (error.error_code, error.description) == (404, "Not Found")


async def test_text_rules(api: TelegramApi) -> None:
    assert (await refused(api, "sendMessage", {"chat_id": PRIVATE_CHAT})).description == (
        "Bad Request: message text is empty"
    )
    blank = await refused(api, "sendMessage", {"chat_id": PRIVATE_CHAT, "text": "  \n"})
    assert blank.description == "Bad Request: message text is empty"
    long = await refused(api, "sendMessage", {"chat_id": PRIVATE_CHAT, "text": "x" * 4097})
    assert long.description == "Bad Request: message is too long"
    await api.call("sendMessage", {"chat_id": PRIVATE_CHAT, "text": "x" * 4096})


async def test_unknown_parameters_are_refused(api: TelegramApi) -> None:
    error = await refused(api, "sendMessage", {"chat_id": PRIVATE_CHAT, "text": "x", "txt": "y"})
    assert error.error_code == 400 and "unknown parameter" in error.description


async def test_edits_must_change_the_message(api: TelegramApi, fake_telegram: FakeTelegram) -> None:
    sent = await api.call("sendMessage", {"chat_id": GROUP_CHAT, "text": "Hello"})
    edit = {"chat_id": GROUP_CHAT, "message_id": sent["message_id"]}
    # Trailing whitespace is trimmed by Telegram: the same message.
    error = await refused(api, "editMessageText", {**edit, "text": "Hello \n"})
    assert error.description == NOT_MODIFIED and error.is_not_modified
    # Same text, new formatting: modified.
    await api.call("editMessageText", {**edit, "text": "<b>Hello</b>", "parse_mode": "HTML"})
    missing = await refused(api, "editMessageText", {**edit, "message_id": 1, "text": "x"})
    assert missing.description == "Bad Request: message to edit not found"
    assert fake_telegram.messages(GROUP_CHAT)[0].edits == 1


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("<b>open", 'Can\'t find end tag corresponding to start tag "b"'),
        ("<b>x</i>", 'Unmatched end tag at byte offset 4, expected "</b>", found "</i>"'),
        ("a <script>", 'Unsupported start tag "script" at byte offset 2'),
        ("1 < 2", 'Unsupported start tag "" at byte offset 2'),
    ],
)
async def test_html_is_checked(api: TelegramApi, source: str, message: str) -> None:
    error = await refused(
        api, "sendMessage", {"chat_id": PRIVATE_CHAT, "text": source, "parse_mode": "HTML"}
    )
    assert error.is_entity_error
    assert error.description == f"Bad Request: can't parse entities: {message}"


async def test_drafts_only_in_private_chats(api: TelegramApi) -> None:
    await api.call("sendMessageDraft", {"chat_id": PRIVATE_CHAT, "draft_id": 7, "text": "..."})
    error = await refused(
        api, "sendMessageDraft", {"chat_id": GROUP_CHAT, "draft_id": 7, "text": "x"}
    )
    assert error.error_code == 400
    zero = await refused(
        api, "sendMessageDraft", {"chat_id": PRIVATE_CHAT, "draft_id": 0, "text": "x"}
    )
    assert zero.error_code == 400


async def test_calls_too_fast_get_429_and_a_penalty(fake_telegram: FakeTelegram) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        url = f"{fake_telegram.base_url}/bot{next(iter(fake_telegram.bots))}/sendMessage"
        bodies = []
        for text in ("a", "b", "c"):
            async with http.post(url, json={"chat_id": GROUP_CHAT, "text": text}) as response:
                bodies.append((response.status, await response.json()))
    assert bodies[0][0] == 200
    assert bodies[1] == (
        429,
        {
            "ok": False,
            "error_code": 429,
            "description": "Too Many Requests: retry after 1",
            "parameters": {"retry_after": 1},
        },
    )
    assert bodies[2][0] == 429 and len(fake_telegram.flood_violations) == 1
