"""A database URL with any valid password works, and its password shows up nowhere.

Each command runs as a real ``botctl`` process, as an operator would run it:
``db``, ``serve`` and ``doctor`` are the paths that print database errors.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from bot.storage.redact import MASK, hide_password, redact

# "Sup3r@Secret:%" percent-encoded, as a database URL must carry it.
ENCODED_PASSWORD = "Sup3r%40Secret%3A%25"
NEEDLE = b"Sup3r"
"""Part of the password in every form it can take (encoded, decoded, %-doubled)."""
UNREACHABLE = f"postgresql+asyncpg://bot:{ENCODED_PASSWORD}@127.0.0.1:1/bot"


def with_password(url: str) -> str:
    scheme, _, rest = url.partition("://")
    user_host, _, database = rest.partition("/")
    user, _, host = user_host.rpartition("@")
    return f"{scheme}://{user or 'postgres'}:{ENCODED_PASSWORD}@{host}/{database}"


async def botctl(url: str, *args: str) -> tuple[int, bytes]:
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "botctl"),
        *args,
        env={
            **os.environ,
            "BOT_CONFIG": "",  # not a ./bot.toml
            "BOT_DATABASE__URL": url,
            "BOT_ENGINE__MODEL": "/nonexistent/model",
            "BOT_SERVER__PORT": "0",
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(120):
        output, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, output


def test_redact_masks_every_form_of_the_password() -> None:
    url = f"postgresql+asyncpg://bot:{ENCODED_PASSWORD}@db.internal:5432/bot"
    text = (
        f"invalid interpolation syntax in '{url}'; password {ENCODED_PASSWORD}, "
        f"decoded Sup3r@Secret:%, escaped {ENCODED_PASSWORD.replace('%', '%%')}"
    )
    masked = redact(text, url)
    assert "Sup3r" not in masked
    assert MASK in masked
    assert "db.internal" in masked, "the rest of the URL still helps"
    assert hide_password("not a url") == "<database url>"


@pytest.mark.postgres
@pytest.mark.parametrize("empty_db_url", ["postgres"], indirect=True)
async def test_a_percent_encoded_password_migrates_and_is_never_shown(
    empty_db_url: str,
) -> None:
    url = with_password(empty_db_url)  # the local server trusts 127.0.0.1: any password works
    code, output = await botctl(url, "serve")
    assert code == 1
    assert b"pending migrations" in output, output
    assert NEEDLE not in output

    code, output = await botctl(url, "db", "upgrade")
    assert code == 0, output
    assert NEEDLE not in output
    code, output = await botctl(url, "db", "check")
    assert code == 0, output

    code, output = await botctl(url, "doctor", "--json")
    assert NEEDLE not in output
    # stderr is merged in: the report is the one JSON document among the log lines.
    start = output.index(b'{\n  "ok"')
    report, _ = json.JSONDecoder().raw_decode(output[start:].decode())
    layers = {document["layer"]: document for document in report["layers"]}
    assert layers["database"]["ok"] and layers["migrations"]["ok"], output


@pytest.mark.parametrize("command", [("db", "upgrade"), ("db", "current"), ("serve",)])
async def test_database_errors_never_show_the_password(command: tuple[str, ...]) -> None:
    code, output = await botctl(UNREACHABLE, *command)
    assert code == 1, output
    assert NEEDLE not in output, output
    assert b"Error:" in output


async def test_doctor_on_an_unreachable_database_never_shows_the_password() -> None:
    code, output = await botctl(UNREACHABLE, "doctor")
    assert code != 0
    assert NEEDLE not in output, output
    assert b"127.0.0.1:1" in output
