"""botctl conversations list/show/export/delete after real turns, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.helpers import count_rows
from tests.ops.helpers import botctl, chat


def env(db_url: str) -> dict[str, str]:
    return {"BOT_DATABASE__URL": db_url, "BOT_CONFIG": ""}


async def test_list_show_export_delete(
    db_url: str, make_client: MakeClient, tmp_path: Path
) -> None:
    client = await make_client(db_url)
    alice = await issue_key(db_url, "alice")
    bob = await issue_key(db_url, "bob")
    for i in range(2):
        assert (await chat(client, alice, "trip", f"m{i}", f"Question {i}"))["kind"] == "done"
    assert (await chat(client, bob, "trip", "m0", "Bob here"))["kind"] == "done"
    await client.server.app[TURNS].wait_idle(timeout=30)

    listed = await botctl("conversations", "list", "--json", env=env(db_url))
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted((row["owner"], row["turns"]) for row in rows) == [
        ("key:alice", 2),
        ("key:bob", 1),
    ]
    [alice_row] = [row for row in rows if row["owner"] == "key:alice"]
    # A key's conversations are its owner's tenant's: key:OWNER (bot.turns.owners).
    only_bob = await botctl("conversations", "list", "--owner", "key:bob", env=env(db_url))
    assert "bob" in only_bob.stdout and "alice" not in only_bob.stdout

    shown = await botctl("conversations", "show", alice_row["id"], env=env(db_url))
    document = json.loads(shown.stdout)
    assert [turn["user_text"] for turn in document["turns"]] == ["Question 0", "Question 1"]
    assert all(turn["status"] == "done" and turn["reply_text"] for turn in document["turns"])
    assert [m["role"] for m in document["messages"]][-4:] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    missing = await botctl("conversations", "show", "nope", env=env(db_url))
    assert missing.exit_code == 1

    # The id the user knows: "trip" is alice's and bob's, so it asks whose.
    ambiguous = await botctl("conversations", "show", "trip", env=env(db_url))
    assert ambiguous.exit_code == 1
    assert "--owner key:alice" in ambiguous.output and "--owner key:bob" in ambiguous.output
    by_key = await botctl("conversations", "show", "trip", "--owner", "key:alice", env=env(db_url))
    assert by_key.exit_code == 0, by_key.output
    assert json.loads(by_key.stdout) == document
    only_one = await botctl(
        "conversations", "show", "trip", "--owner", "key:carol", env=env(db_url)
    )
    assert only_one.exit_code == 1 and "no conversation 'trip'" in only_one.output

    table = (await botctl("conversations", "list", env=env(db_url))).stdout.splitlines()
    assert table[0].split() == ["KEY", "OWNER", "CHANNEL", "TURNS", "STATE", "UPDATED", "ID"]
    assert sorted(line.split()[:4] for line in table[1:]) == [
        ["trip", "key:alice", "api", "2"],
        ["trip", "key:bob", "api", "1"],
    ]

    out = tmp_path / "alice.jsonl"
    exported = await botctl(
        "conversations", "export", "--owner", "key:alice", "-o", str(out), env=env(db_url)
    )
    assert exported.exit_code == 0, exported.output
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == document
    everything = await botctl("conversations", "export", env=env(db_url))
    assert len(everything.stdout.splitlines()) == 2

    before = await count_rows(db_url)
    refused = await botctl("conversations", "delete", env=env(db_url))
    assert refused.exit_code == 2  # no selection: refuses to erase everything
    deleted = await botctl(
        "conversations", "delete", "--owner", "key:alice", "--yes", env=env(db_url)
    )
    assert deleted.exit_code == 0, deleted.output
    report = json.loads(deleted.stdout)["deleted"]
    assert report == {
        "conversations": 1,
        "turns": 2,
        "messages": len(document["messages"]),
        "inbound_events": 2,
    }
    after = await count_rows(db_url)
    assert after == {
        "conversations": before["conversations"] - 1,
        "turns": before["turns"] - 2,
        "inbound_events": before["inbound_events"] - 2,
        "messages": before["messages"] - len(document["messages"]),
    }
    # Bob's conversation is untouched, and alice can start over.
    left = await botctl("conversations", "list", "--json", env=env(db_url))
    assert [json.loads(line)["owner"] for line in left.stdout.splitlines()] == ["key:bob"]
    assert (await chat(client, alice, "trip", "m0", "Again"))["kind"] == "done"


async def test_show_by_key_after_starting_over_shows_the_newest(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    alice = await issue_key(db_url, "alice")
    assert (await chat(client, alice, "trip", "m0", "Before"))["kind"] == "done"
    await client.server.app[TURNS].new_conversation(
        channel="api", owner="key:alice", conversation_key="trip"
    )
    assert (await chat(client, alice, "trip", "m1", "After"))["kind"] == "done"
    await client.server.app[TURNS].wait_idle(timeout=30)

    shown = await botctl("conversations", "show", "trip", env=env(db_url))
    assert shown.exit_code == 0, shown.output
    assert [turn["user_text"] for turn in json.loads(shown.stdout)["turns"]] == ["After"]
    assert "newest of 2 conversations" in shown.stderr
