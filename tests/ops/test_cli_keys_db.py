"""botctl keys and db, in-process, against real SQLite and PostgreSQL databases."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from bot.apikeys import KEY_CHECK_TTL_S
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import ApiKey, as_utc
from tests.conftest import MakeClient
from tests.helpers import auth
from tests.ops.helpers import botctl


def env(db_url: str) -> dict[str, str]:
    return {"BOT_DATABASE__URL": db_url, "BOT_CONFIG": ""}


async def stored_keys(db_url: str) -> list[ApiKey]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            return list((await session.scalars(select(ApiKey).order_by(ApiKey.created_at))).all())
    finally:
        await engine.dispose()


async def status_with(client: object, key: str) -> int:
    response = await client.get("/v1/turns/none", headers=auth(key))  # type: ignore[attr-defined]
    return int(response.status)


async def refused_within_a_check(client: object, key: str) -> float:
    """Seconds until ``key`` is refused; fails past the time a checked key is trusted."""
    started = time.monotonic()
    while await status_with(client, key) != 401:
        waited = time.monotonic() - started
        assert waited < KEY_CHECK_TTL_S + 0.5, f"still accepted after {waited:.2f} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_keys_create_list_revoke_rotate(db_url: str, make_client: MakeClient) -> None:
    client = await make_client(db_url)
    created = await botctl("keys", "create", "alice", "--expires", "30d", env=env(db_url))
    assert created.exit_code == 0, created.output
    key = created.stdout.strip()
    assert key.startswith("bot_") and len(key.splitlines()) == 1
    assert await status_with(client, key) == 404  # authenticated: the turn just does not exist
    # Its use is written by the service's background refresh, within half a second.
    deadline = time.monotonic() + 5.0
    while (await stored_keys(db_url))[0].last_used_at is None:
        assert time.monotonic() < deadline, "the key's use was never written"
        await asyncio.sleep(0.1)

    [record] = await stored_keys(db_url)
    assert key not in (record.secret_hash, record.prefix) and key.split("_", 2)[2] not in str(
        vars(record)
    )
    assert record.expires_at is not None
    expires_in = as_utc(record.expires_at) - dt.datetime.now(dt.UTC)
    assert dt.timedelta(days=29, hours=23) < expires_in <= dt.timedelta(days=30)

    admin = await botctl("keys", "create", "ops", "--scope", "admin", env=env(db_url))
    assert admin.exit_code == 0

    listed = await botctl("keys", "list", "--json", env=env(db_url))
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(row["name"], row["scopes"], row["state"]) for row in rows] == [
        ("alice", "chat", "active"),
        ("ops", "admin", "active"),
    ]
    assert rows[0]["last_used"] != "-"  # alice's key was used above
    assert key not in listed.output and admin.stdout.strip() not in listed.output
    table = await botctl("keys", "list", env=env(db_url))
    assert table.stdout.splitlines()[0].split()[:3] == ["NAME", "PREFIX", "OWNER"]

    rotated = await botctl("keys", "rotate", rows[0]["prefix"], env=env(db_url))
    assert rotated.exit_code == 0, rotated.output
    new_key = rotated.stdout.strip()
    assert new_key != key and new_key.startswith("bot_")
    await refused_within_a_check(client, key)  # revoked within a second, no restart
    assert await status_with(client, new_key) == 404
    records = await stored_keys(db_url)
    successor = next(r for r in records if r.prefix == new_key.split("_")[1])
    assert successor.name == "alice" and successor.scopes == "chat"
    assert successor.expires_at is not None  # the same 30-day lifetime, from now

    revoked = await botctl("keys", "revoke", new_key.split("_")[1], env=env(db_url))
    assert revoked.exit_code == 0
    await refused_within_a_check(client, new_key)

    missing = await botctl("keys", "revoke", "nosuchkey", env=env(db_url))
    assert missing.exit_code == 1 and "no key" in missing.output


async def test_rotate_with_overlap_keeps_the_old_key_working_for_a_while(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    key = (await botctl("keys", "create", "bob", env=env(sqlite_url))).stdout.strip()
    rotated = await botctl("keys", "rotate", key, "--overlap", "1h", env=env(sqlite_url))
    assert rotated.exit_code == 0, rotated.output
    new_key = rotated.stdout.strip()
    assert await status_with(client, key) == 404  # still valid for an hour
    assert await status_with(client, new_key) == 404
    old = next(r for r in await stored_keys(sqlite_url) if r.prefix == key.split("_")[1])
    assert old.revoked_at is None and old.expires_at is not None
    # Two live keys named bob now: a name is ambiguous, a prefix is not.
    ambiguous = await botctl("keys", "revoke", "bob", env=env(sqlite_url))
    assert ambiguous.exit_code == 1 and "give a prefix" in ambiguous.output


async def test_expired_key_gets_401(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    key = (
        await botctl("keys", "create", "short", "--expires", "1s", env=env(sqlite_url))
    ).stdout.strip()
    engine = create_engine(sqlite_url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            record = (await session.scalars(select(ApiKey))).one()
            record.expires_at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    finally:
        await engine.dispose()
    assert await status_with(client, key) == 401


async def test_bad_expiry_and_scope_are_refused(sqlite_url: str) -> None:
    bad = await botctl("keys", "create", "x", "--expires", "soon", env=env(sqlite_url))
    assert bad.exit_code == 2 and "duration" in bad.output
    bad = await botctl("keys", "create", "x", "--scope", "root", env=env(sqlite_url))
    assert bad.exit_code == 2
    assert await stored_keys(sqlite_url) == []


@pytest.mark.parametrize(
    "empty_db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_db_check_upgrade_current_history_downgrade(empty_db_url: str) -> None:
    e = env(empty_db_url)
    check = await botctl("db", "check", env=e)
    assert check.exit_code == 1 and "botctl db upgrade" in check.output
    assert (await botctl("db", "current", env=e)).stdout.strip() == "(empty)"

    assert (await botctl("db", "upgrade", env=e)).exit_code == 0
    check = await botctl("db", "check", env=e)
    assert check.exit_code == 0, check.output
    head = (await botctl("db", "current", env=e)).stdout.strip()
    history = (await botctl("db", "history", env=e)).stdout.splitlines()
    assert history[0].split()[0] == "0001"
    assert [line for line in history if line.startswith("*")] == [
        line for line in history if line.split()[1] == head
    ]

    refused = await botctl("db", "downgrade", "0001", env=e, input="n\n")
    assert refused.exit_code == 1
    assert (await botctl("db", "current", env=e)).stdout.strip() == head
    down = await botctl("db", "downgrade", "0001", "--yes", env=e)
    assert down.exit_code == 0, down.output
    assert (await botctl("db", "current", env=e)).stdout.strip() == "0001"
    assert (await botctl("db", "check", env=e)).exit_code == 1


async def test_serve_refuses_a_database_with_pending_migrations(tmp_path: Path) -> None:
    # A real process: serve configures logging for the whole process it runs in.
    url = f"sqlite+aiosqlite:///{tmp_path}/fresh.db"
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "botctl"),
        "serve",
        env={**os.environ, **env(url), "BOT_SERVER__PORT": "0"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        _stdout, stderr = await process.communicate()
    assert process.returncode == 1
    assert b"pending migrations" in stderr and b"botctl db upgrade" in stderr


async def test_a_name_a_live_key_has_is_refused_unless_allowed(db_url: str) -> None:
    first = await botctl("keys", "create", "alice", env=env(db_url))
    assert first.exit_code == 0, first.output
    prefix = first.stdout.strip().split("_")[1]

    again = await botctl("keys", "create", "alice", env=env(db_url))
    assert again.exit_code == 1
    assert "already named 'alice'" in again.output and prefix in again.output
    assert "--allow-duplicate" in again.output
    assert again.stdout == "", "no key printed"
    assert len(await stored_keys(db_url)) == 1

    allowed = await botctl("keys", "create", "alice", "--allow-duplicate", env=env(db_url))
    assert allowed.exit_code == 0 and allowed.stdout.startswith("bot_")
    assert len(await stored_keys(db_url)) == 2

    # A revoked key's name is free again.
    for record in await stored_keys(db_url):
        assert (await botctl("keys", "revoke", record.prefix, env=env(db_url))).exit_code == 0
    reused = await botctl("keys", "create", "alice", env=env(db_url))
    assert reused.exit_code == 0, reused.output
