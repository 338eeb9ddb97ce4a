"""An API key named like a platform's tenant reaches none of that tenant's turns.

Key owners and platform tenants live in separate namespaces (``bot.turns.owners``):
the attack runs from outside, as an operator's mistake or a malicious admin would
make it, with ``botctl keys create --owner telegram:testbot`` and the HTTP API.
"""

from __future__ import annotations

import pytest

from bot.testing.telegram_api import FakeTelegram
from bot.turns.owners import KEY_OWNER_MAX_CHARS
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth
from tests.ops.helpers import botctl
from tests.telegram.conftest import PRIVATE_CHAT, Service, bot_table, private_update

BOT_TENANT = "telegram:testbot"


def _env(db_url: str) -> dict[str, str]:
    return {"BOT_DATABASE__URL": db_url, "BOT_CONFIG": ""}


async def test_a_key_named_like_a_bot_never_reads_or_regenerates_its_turns(
    db_url: str, make_client: MakeClient, fake_telegram: FakeTelegram
) -> None:
    client = await make_client(db_url, telegram=[bot_table(fake_telegram)])
    service = Service(client, fake_telegram, db_url)
    assert await service.post(private_update("What is my secret plan?")) == 200
    await service.idle()
    [turn] = await service.turns()
    assert turn.status == "done"
    replies = fake_telegram.texts(PRIVATE_CHAT)

    created = await botctl("keys", "create", "mallory", "--owner", BOT_TENANT, env=_env(db_url))
    assert created.exit_code == 0, created.output
    key = created.stdout.strip()

    headers = auth(key)
    reads = {
        "turn": await client.get(f"/v1/turns/{turn.id}", headers=headers),
        "events": await client.get(f"/v1/turns/{turn.id}/events", headers=headers),
        "history": await client.get(
            f"/v1/conversations/chat:{PRIVATE_CHAT}/turns", headers=headers
        ),
    }
    assert reads["turn"].status == 404
    assert reads["events"].status == 404
    # The key's own conversation of that name: empty, never the bot's.
    if reads["history"].status == 200:
        assert "secret plan" not in await reads["history"].text()
    else:
        assert reads["history"].status == 404
    for action, body in (
        ("regenerate", None),
        ("edit", {"text": "Tell me everything"}),
        ("activate", None),
        ("continue", None),
        ("cancel", None),
    ):
        response = await client.post(f"/v1/turns/{turn.id}/{action}", json=body, headers=headers)
        assert response.status == 404, (action, await response.text())

    await service.idle()
    assert [t.id for t in await service.turns()] == [turn.id]
    assert fake_telegram.texts(PRIVATE_CHAT) == replies  # nothing posted into the chat


async def test_a_key_owner_is_checked_when_the_key_is_made(db_url: str) -> None:
    env = _env(db_url)
    too_long = await botctl(
        "keys", "create", "k", "--owner", "x" * (KEY_OWNER_MAX_CHARS + 1), env=env
    )
    assert too_long.exit_code != 0
    assert "at most" in too_long.output and "Traceback" not in too_long.output
    control = await botctl("keys", "create", "k", "--owner", "bad\nowner", env=env)
    assert control.exit_code != 0 and "control characters" in control.output
    longest = await botctl("keys", "create", "k", "--owner", "x" * KEY_OWNER_MAX_CHARS, env=env)
    assert longest.exit_code == 0, longest.output


@pytest.mark.parametrize("owner", ["T0001TEAM", "webhook:crm", "key:alice"])
async def test_keys_act_for_their_own_namespace_only(
    sqlite_url: str, make_client: MakeClient, owner: str
) -> None:
    """Whatever a key's owner is called, its conversations are stored under ``key:``."""
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url, "k", owner=owner)
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": "c", "message_id": "m", "text": "hi"},
        headers=auth(key),
    )
    assert response.status == 202
    usage = await (await client.get("/v1/usage", headers=auth(key))).json()
    assert usage["owner"] == f"key:{owner}"
