"""End to end: really signed interactions -> the real app and vLLM engine -> the fake Discord API.

Requests are signed with the application's Ed25519 private key as Discord signs
them; the reply comes back as edits of the deferred response (and follow-ups)
in the strict fake, which refuses what Discord would refuse.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest

from bot.testing.discord_api import MAX_CONTENT, FakeDiscordApi
from tests.conftest import MakeClient
from tests.discord.conftest import (
    DM_CHANNEL,
    GUILD_CHANNEL,
    ask,
    discord_section,
    idle,
    interact,
    load_fixture,
    post_signed,
    sign,
)
from tests.helpers import count_rows, load_turns

# Discord wants the interaction answered within 3 s; we hold ourselves to far less.
ACK_BUDGET_S = 3.0
EDIT_ROUTE = "PATCH /webhooks/{id}/{token}/messages/{id}"
FOLLOW_UP_ROUTE = "POST /webhooks/{id}/{token}"


async def test_ping_is_answered_with_pong(
    discord_api: FakeDiscordApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, discord=discord_section(discord_api.base_url))
    status, document, _ = await post_signed(client, json.dumps(load_fixture("ping")).encode())
    assert (status, document) == (200, {"type": 1})


@pytest.mark.parametrize(
    "tamper",
    ["no_headers", "other_key", "tampered_body", "stale", "future", "garbage_ts", "not_hex"],
)
async def test_bad_missing_or_replayed_signatures_get_401_and_store_nothing(
    discord_api: FakeDiscordApi, make_client: MakeClient, db_url: str, tamper: str
) -> None:
    client = await make_client(db_url, discord=discord_section(discord_api.base_url))
    raw = json.dumps(ask("1220000000000000100", "hello")).encode()
    now = int(time.time())
    if tamper == "no_headers":
        response = await client.post("/discord/main", data=raw)
        status = response.status
    elif tamper == "other_key":
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        other = Ed25519PrivateKey.generate().sign(str(now).encode() + raw).hex()
        status, _, _ = await post_signed(client, raw, timestamp=now, signature=other)
    elif tamper == "tampered_body":
        signature = sign(raw, str(now))
        status, _, _ = await post_signed(
            client, raw.replace(b"hello", b"HELLO"), timestamp=now, signature=signature
        )
    elif tamper == "stale":
        status, _, _ = await post_signed(client, raw, timestamp=now - 5 * 60 - 30)
    elif tamper == "future":
        status, _, _ = await post_signed(client, raw, timestamp=now + 5 * 60 + 30)
    elif tamper == "garbage_ts":
        headers = {"X-Signature-Timestamp": "yesterday", "X-Signature-Ed25519": "00" * 64}
        status = (await client.post("/discord/main", data=raw, headers=headers)).status
    else:
        status, _, _ = await post_signed(client, raw, signature="zz" * 64)
    assert status == 401
    await idle(client)
    assert (await count_rows(db_url))["inbound_events"] == 0
    assert await load_turns(db_url) == []
    assert discord_api.calls == []


async def test_ask_is_deferred_stored_and_answered_by_paced_edits(
    discord_api: FakeDiscordApi, make_client: MakeClient, db_url: str
) -> None:
    client = await make_client(
        db_url,
        discord=discord_section(discord_api.base_url, edit_interval_s=0.4),
        generation={"max_tokens": 300},
    )
    body = ask("1220000000000000101", "hello")
    status, document, elapsed = await interact(client, discord_api, body)
    assert (status, document) == (200, {"type": 5})
    assert elapsed < ACK_BUDGET_S
    await idle(client)

    [turn] = await load_turns(db_url)
    assert turn.status == "done" and turn.reply_text
    assert turn.user_text == "hello"
    assert turn.user_name == "Alice"  # the member's server nickname, in a server channel
    [shown] = discord_api.interaction_messages(body["token"])
    assert shown.strip() == turn.reply_text.strip()
    edits = discord_api.calls_on(EDIT_ROUTE)
    assert len(edits) >= 2 and all(call.status == 200 for call in edits)
    # About one edit per edit_interval_s (0.4 s here; the fake's buckets alone would allow
    # one every 0.2 s), over the whole reply. The client spaces the calls it sends; the fake
    # shares the test's event loop and may see one late, so a single gap can look shorter.
    gaps = [b.at - a.at for a, b in itertools.pairwise(edits)]
    assert sum(gaps) / len(gaps) >= 0.9 * 0.4, gaps
    assert discord_api.violations == [] and discord_api.pings == []


async def test_a_long_reply_continues_in_follow_ups_of_at_most_the_limit(
    discord_api: FakeDiscordApi, make_client: MakeClient, db_url: str
) -> None:
    client = await make_client(
        db_url,
        discord=discord_section(discord_api.base_url, max_message_chars=100),
        generation={"max_tokens": 160},
    )
    body = ask("1220000000000000102", "Tell me a long story", dm=True)
    status, document, _ = await interact(client, discord_api, body)
    assert (status, document) == (200, {"type": 5})
    await idle(client)
    [turn] = await load_turns(db_url)
    assert turn.status == "done", turn.error_message
    shown = discord_api.interaction_messages(body["token"])
    assert len(shown) >= 2, shown
    assert all(0 < len(piece) <= 100 for piece in shown), [len(p) for p in shown]
    assert len(discord_api.calls_on(FOLLOW_UP_ROUTE)) == len(shown) - 1
    # Pieces are cut at spaces and newlines: together they hold every word of the reply.
    assert "".join(shown).split() == (turn.reply_text or "").split() or (
        " ".join(shown).split() == (turn.reply_text or "").split()
    )
    assert discord_api.violations == []


async def test_a_429_is_waited_out_with_no_call_while_its_retry_runs(
    discord_api: FakeDiscordApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, discord=discord_section(discord_api.base_url))
    discord_api.rate_limit_next(EDIT_ROUTE, retry_after=1.0)
    body = ask("1220000000000000103", "hello")
    await interact(client, discord_api, body)
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "done", turn.error_message
    assert discord_api.interaction_messages(body["token"])[0].strip() == (turn.reply_text or "")
    edits = discord_api.calls_on(EDIT_ROUTE)
    limited = next(i for i, call in enumerate(edits) if call.status == 429)
    assert edits[limited + 1].at - edits[limited].at >= 1.0
    assert discord_api.violations == []


async def test_several_channels_and_a_dm_at_once(
    discord_api: FakeDiscordApi, make_client: MakeClient, db_url: str
) -> None:
    client = await make_client(db_url, discord=discord_section(discord_api.base_url))
    bodies = [
        ask(f"122000000000000020{i}", f"question {i}", channel_id=f"111000000000000010{i}")
        for i in range(3)
    ] + [ask("1220000000000000210", "a DM question", dm=True)]
    answers = await asyncio.gather(*(interact(client, discord_api, body) for body in bodies))
    assert all(status == 200 and doc == {"type": 5} for status, doc, _ in answers)
    await idle(client)
    turns = await load_turns(db_url)
    assert len(turns) == 4 and all(turn.status == "done" for turn in turns)
    assert len({turn.conversation_id for turn in turns}) == 4
    by_text = {turn.user_text: turn for turn in turns}
    for body in bodies:
        turn = by_text[body["data"]["options"][0]["value"]]
        assert discord_api.interaction_messages(body["token"])[0].strip() == turn.reply_text
    assert discord_api.violations == []


async def test_a_repeated_interaction_is_stored_and_answered_once(
    discord_api: FakeDiscordApi, make_client: MakeClient, db_url: str
) -> None:
    client = await make_client(db_url, discord=discord_section(discord_api.base_url))
    body = ask("1220000000000000104", "only once")
    first = await interact(client, discord_api, body)
    second = await interact(client, discord_api, body)
    assert first[:2] == second[:2] == (200, {"type": 5})
    await idle(client)
    assert len(await load_turns(db_url)) == 1


async def test_guild_and_dm_share_nothing_and_a_channel_keeps_its_conversation(
    discord_api: FakeDiscordApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, discord=discord_section(discord_api.base_url))
    await interact(client, discord_api, ask("1220000000000000105", "one"))
    await idle(client)
    await interact(client, discord_api, ask("1220000000000000106", "two"))
    await interact(client, discord_api, ask("1220000000000000107", "three", dm=True))
    await idle(client)
    turns = {turn.user_text: turn for turn in await load_turns(sqlite_url)}
    assert turns["one"].conversation_id == turns["two"].conversation_id
    assert turns["three"].conversation_id != turns["one"].conversation_id
    assert turns["three"].user_name is None  # a DM has one speaker: no name prefix
    assert GUILD_CHANNEL != DM_CHANNEL and MAX_CONTENT == 2000
