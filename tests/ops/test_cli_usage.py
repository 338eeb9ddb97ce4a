"""botctl usage after real turns, on SQLite and PostgreSQL: the table, --json and the filters."""

from __future__ import annotations

import datetime as dt
import json

from bot.http.keys import TURNS
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Turn
from tests.conftest import MakeClient, issue_key
from tests.helpers import store_turns
from tests.ops.helpers import botctl, chat


def env(db_url: str) -> dict[str, str]:
    return {"BOT_DATABASE__URL": db_url, "BOT_CONFIG": ""}


async def _stored_turns(db_url: str) -> list[Turn]:
    from sqlalchemy import select

    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            return list((await session.scalars(select(Turn))).all())
    finally:
        await engine.dispose()


async def test_usage_per_day_owner_and_channel(db_url: str, make_client: MakeClient) -> None:
    client = await make_client(db_url)
    alice = await issue_key(db_url, "alice")
    bob = await issue_key(db_url, "bob")
    for i in range(2):
        assert (await chat(client, alice, "trip", f"m{i}", f"Question {i}"))["kind"] == "done"
    assert (await chat(client, bob, "trip", "m0", "Bob here"))["kind"] == "done"
    await client.server.app[TURNS].wait_idle(timeout=30)
    stored = [t for t in await _stored_turns(db_url) if t.channel == "api"]
    # A Telegram user's turn three days ago: outside --days 1, inside --since that day.
    three_days_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=3)
    engine = create_engine(db_url)
    await store_turns(
        create_sessionmaker(engine),
        owner="telegram:support",
        channel="telegram:support",
        key="chat:1",
        turns=[(three_days_ago, "failed", "42", 40, 16, None)],
    )
    await engine.dispose()

    listed = await botctl("usage", "--json", env=env(db_url))
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert {(r["day"], r["owner"], r["channel"]) for r in rows} == {
        (three_days_ago.date().isoformat(), "telegram:support", "telegram:support"),
        (today, "key:alice", "api"),
        (today, "key:bob", "api"),
    }
    [alice_row] = [r for r in rows if r["owner"] == "key:alice"]
    # The second turn's prompt starts with the first one's: the cache served part of it.
    assert alice_row["turns_done"] == 2 and alice_row["turns_failed"] == 0
    alice_turns = [t for t in stored if t.user_text.startswith("Question")]
    assert alice_row["prompt_tokens"] == sum(t.prompt_tokens or 0 for t in alice_turns)
    assert alice_row["cached_tokens"] == sum(t.cached_tokens or 0 for t in alice_turns) > 0
    assert alice_row["completion_tokens"] == sum(t.completion_tokens or 0 for t in alice_turns)
    assert alice_row["cache_share"] == alice_row["cached_tokens"] / alice_row["prompt_tokens"]
    [old] = [r for r in rows if r["owner"] == "telegram:support"]
    assert (old["turns_done"], old["turns_failed"], old["cache_share"]) == (0, 1, 0.4)

    only_bob = await botctl("usage", "--owner", "key:bob", "--json", env=env(db_url))
    assert [json.loads(line)["owner"] for line in only_bob.stdout.splitlines()] == ["key:bob"]
    one_day = await botctl("usage", "--days", "1", "--json", env=env(db_url))
    assert {json.loads(line)["owner"] for line in one_day.stdout.splitlines()} == {
        "key:alice",
        "key:bob",
    }
    since = await botctl(
        "usage",
        "--channel",
        "telegram:support",
        "--since",
        three_days_ago.date().isoformat(),
        "--json",
        env=env(db_url),
    )
    assert [json.loads(line)["turns_failed"] for line in since.stdout.splitlines()] == [1]
    both = await botctl("usage", "--days", "2", "--since", today, env=env(db_url))
    assert both.exit_code == 2

    table = await botctl("usage", "--days", "1", env=env(db_url))
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "day",
        "owner",
        "channel",
        "done",
        "failed",
        "stopped",
        "prompt",
        "cached",
        "completion",
        "cache",
    ]
    assert [line.split()[:3] for line in lines[1:3]] == [
        [today, "key:alice", "api"],
        [today, "key:bob", "api"],
    ]
    total = lines[-1].split()
    assert total[0] == "total" and total[1] == "3" and total[2] == "0"
    assert total[-1] == f"{_share(rows):.0%}"

    nothing = await botctl("usage", "--owner", "nobody", env=env(db_url))
    assert nothing.exit_code == 0 and nothing.stdout == ""
    assert "no turns since" in nothing.stderr


def _share(rows: list[dict[str, object]]) -> float:
    api = [r for r in rows if r["channel"] == "api"]
    cached = sum(int(str(r["cached_tokens"])) for r in api)
    prompt = sum(int(str(r["prompt_tokens"])) for r in api)
    return cached / prompt
