"""``/stats`` on Telegram: the sender's turns and tokens today against their daily limit.

Real app, engine and database; Telegram is the strict fake. The figures are
recomputed here from the stored turns, the way fair use charges them.
"""

from __future__ import annotations

from typing import Any

from bot.channels.stats import NOT_ADMIN_TEXT
from bot.channels.telegram.commands import HELP_TEXT, run_command
from bot.channels.telegram.payloads import BotIdentity, Command, parse_update
from bot.http.keys import TURNS, USAGE
from bot.storage.models import Turn
from tests.telegram.conftest import (
    BOT_USERNAME,
    GROUP_CHAT,
    PRIVATE_CHAT,
    Service,
    command_update,
    fixture_update,
    private_update,
)

OTHER_CHAT = 222222222
DAILY = 100_000


def _counted(turns: list[Turn]) -> int:
    """What fair use charged: prompt tokens not served from the cache, plus generated ones."""
    return sum(
        (t.prompt_tokens or 0) - (t.cached_tokens or 0) + (t.completion_tokens or 0) for t in turns
    )


async def test_stats_shows_the_senders_day_against_their_limit(start_service: Any) -> None:
    service: Service = await start_service(limits={"tokens_per_day": DAILY})
    for text in ("My name is Alice.", "What is my name?"):
        assert await service.post(private_update(text)) == 200
        await service.idle()
    assert await service.post(private_update("I am someone else", chat_id=OTHER_CHAT)) == 200
    await service.idle()

    assert await service.post(fixture_update("private_command_stats")) == 200
    await service.fake.wait_until(
        lambda: service.fake.texts(PRIVATE_CHAT)[-1].startswith("Your usage today"),
        what="the /stats answer",
    )
    answer = service.fake.texts(PRIVATE_CHAT)[-1]
    alice = [t for t in await service.turns() if t.user_id == str(PRIVATE_CHAT)]
    assert len(alice) == 2 and all(t.status == "done" for t in alice)
    prompt = sum(t.prompt_tokens or 0 for t in alice)
    cached = sum(t.cached_tokens or 0 for t in alice)
    generated = sum(t.completion_tokens or 0 for t in alice)
    # The second prompt extends the first: part of it came from the prefix cache.
    assert cached > 0
    lines = answer.splitlines()
    assert lines[0].endswith(", UTC):")
    assert lines[1] == "Messages: 2 answered"
    assert lines[2] == f"Prompt tokens: {prompt:,}, {cached / prompt:.0%} served from the cache"
    assert lines[3] == f"Generated tokens: {generated:,}"
    used = _counted(alice)
    assert lines[4].startswith(
        f"Daily limit: {used:,} of {DAILY:,} tokens used ({used / DAILY:.0%})"
    )
    # A command is not a turn: nothing was stored for it.
    assert len(await service.turns()) == 3


async def test_stats_without_a_limit_and_before_any_message(start_service: Any) -> None:
    service: Service = await start_service(limits={"tokens_per_day": 0})
    assert await service.post(command_update("stats")) == 200
    await service.fake.wait_until(
        lambda: bool(service.fake.texts(PRIVATE_CHAT)), what="the /stats answer"
    )
    [answer] = service.fake.texts(PRIVATE_CHAT)
    assert answer.splitlines()[1:] == [
        "Messages: 0 answered",
        "Prompt tokens: 0, - served from the cache",
        "Generated tokens: 0",
        "Daily limit: none (0 tokens counted today).",
    ]
    assert "/stats" in HELP_TEXT


async def test_stats_all_is_for_admins(start_service: Any) -> None:
    service: Service = await start_service()
    assert await service.post(private_update("hello")) == 200
    assert await service.post(private_update("hi there", chat_id=OTHER_CHAT)) == 200
    await service.idle()

    # Alice is no admin of this bot: the group is told so, in reply to her command.
    update = fixture_update("group_command_stats_all")
    assert await service.post(update) == 200
    await service.fake.wait_until(
        lambda: service.fake.texts(GROUP_CHAT) == [NOT_ADMIN_TEXT], what="the refusal"
    )

    # With an admin check that names her, the same command lists every user of the bot.
    command = parse_update(
        update, bot=BotIdentity(id=None, username=BOT_USERNAME), channel="telegram:testbot"
    )
    assert isinstance(command, Command) and command.args == "all"
    app = service.client.server.app
    answer = await run_command(
        command,
        channel="telegram:testbot",
        turns=app[TURNS],
        usage=app[USAGE],
        is_admin=lambda user_id: user_id == str(PRIVATE_CHAT),
    )
    assert answer is not None
    lines = answer.splitlines()
    assert lines[0].startswith("Usage today (") and lines[0].endswith("UTC), 2 users:")
    turns = {t.user_id: t for t in await service.turns()}
    for user_id in (str(PRIVATE_CHAT), str(OTHER_CHAT)):
        turn = turns[user_id]
        assert any(
            line.startswith(f"{user_id}: 1 answered; {turn.prompt_tokens:,} prompt tokens")
            for line in lines
        ), (user_id, lines)
    assert lines[-1].startswith("Total: 2 answered; ")

    # An admin's own /stats: no limit applies to them.
    own = parse_update(
        fixture_update("private_command_stats"),
        bot=BotIdentity(id=None, username=BOT_USERNAME),
        channel="telegram:testbot",
    )
    assert isinstance(own, Command)
    mine = await run_command(
        own,
        channel="telegram:testbot",
        turns=app[TURNS],
        usage=app[USAGE],
        is_admin=lambda user_id: user_id == str(PRIVATE_CHAT),
    )
    assert mine is not None
    assert mine.splitlines()[1] == "Messages: 1 answered"
    assert mine.splitlines()[-1].startswith("Daily limit: none, you are an admin (")
