"""``/stats`` on Slack: the user's turns and tokens today against their daily limit.

Real app, engine and database; the Slack Web API is the strict fake, and the
command is the real-shaped, signed form of ``tests/slack/fixtures``.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from bot.channels.slack.commands import HELP_TEXT, parse_form
from bot.channels.stats import NOT_ADMIN_TEXT
from bot.storage.models import Turn
from bot.testing.slack_api import FakeSlackApi
from tests.conftest import MakeClient
from tests.helpers import load_turns
from tests.slack.conftest import (
    CHANNEL,
    FIXTURES,
    TEAM,
    dm_message,
    ephemeral,
    idle,
    mention,
    post_command,
    post_event,
    slack_section,
)

STATS_FIXTURE = FIXTURES / "slash_command_stats_in_dm.txt"
DAILY = 50_000


def stats_form(**fields: str) -> dict[str, str]:
    form = dict(parse_qsl(STATS_FIXTURE.read_text().strip(), keep_blank_values=True))
    return {**form, **fields}


def _counted(turns: list[Turn]) -> int:
    return sum(
        (t.prompt_tokens or 0) - (t.cached_tokens or 0) + (t.completion_tokens or 0) for t in turns
    )


def test_the_fixture_is_a_stats_command_in_a_dm() -> None:
    command = parse_form(STATS_FIXTURE.read_text().strip())
    assert (command.name, command.team_id, command.user_id, command.text) == (
        "stats",
        TEAM,
        "U0001ALICE",
        "",
    )
    assert command.in_dm
    assert parse_form(STATS_FIXTURE.read_text().strip().replace("text=", "text=all")).text == "all"


async def test_stats_counts_the_users_dm_and_threads_against_their_limit(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url, slack=slack_section(slack_api.base_url), limits={"tokens_per_day": DAILY}
    )
    await post_event(client, dm_message("Ev2000DM", "1700000100.000300", "remember me"))
    await idle(client)
    await post_event(client, dm_message("Ev2001DM", "1700000200.000300", "who am I?"))
    await idle(client)
    await post_event(client, mention("Ev2002MENTION", "1700000300.000100"))
    await post_event(client, mention("Ev2003MENTION", "1700000400.000100", user="U0002BOB"))
    await idle(client)
    turns = await load_turns(sqlite_url)
    alice = [t for t in turns if t.user_id == "U0001ALICE"]
    assert len(alice) == 3 and all(t.status == "done" for t in alice)

    status, document = await post_command(client, stats_form())
    assert status == 200 and document["response_type"] == "ephemeral"
    lines = document["text"].splitlines()
    prompt = sum(t.prompt_tokens or 0 for t in alice)
    cached = sum(t.cached_tokens or 0 for t in alice)
    assert cached > 0  # the DM's second prompt extends its first
    assert lines[0].startswith("Your usage today (") and lines[0].endswith(", UTC):")
    assert lines[1] == "Messages: 3 answered"
    assert lines[2] == f"Prompt tokens: {prompt:,}, {cached / prompt:.0%} served from the cache"
    assert lines[3] == f"Generated tokens: {sum(t.completion_tokens or 0 for t in alice):,}"
    used = _counted(alice)
    assert lines[4].startswith(f"Daily limit: {used:,} of {DAILY:,} tokens used")

    # Ephemeral, so it answers in a channel too, with the same figures.
    in_channel = stats_form(channel_id=CHANNEL, channel_name="general")
    assert await post_command(client, in_channel) == (200, document)
    # Nothing was stored for the commands.
    assert len(await load_turns(sqlite_url)) == 4


async def test_stats_all_is_for_admins_and_help_lists_stats(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    assert await post_command(client, stats_form(text="all")) == (200, ephemeral(NOT_ADMIN_TEXT))
    assert "`/stats`" in HELP_TEXT
