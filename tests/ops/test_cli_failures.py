"""Every ``botctl`` command that uses the database answers one that refuses with one line.

The commands run against databases that refuse, each in its own way: a
PostgreSQL server that has no such database, a port where nothing listens, an
SQLite file in a folder that does not exist, and a database whose tables were
never made. Each must end with exit status 1 and one ``Error:`` line that says
the database failed, with no traceback and no password (``bot.cli.failures``).
A command added later must be listed here, as using the database or not.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click
import pytest

from bot.cli import main
from tests.conftest import POSTGRES_ADMIN_DSN
from tests.ops.helpers import botctl

PASSWORD = "SWORDFISH-42"
DATABASE_COMMANDS: dict[tuple[str, ...], list[str]] = {
    ("serve",): [],
    ("db", "upgrade"): [],
    ("db", "downgrade"): ["0001", "--yes"],
    ("db", "current"): [],
    ("db", "check"): [],
    ("keys", "create"): ["k"],
    ("keys", "list"): [],
    ("keys", "revoke"): ["k"],
    ("keys", "rotate"): ["k"],
    ("conversations", "list"): [],
    ("conversations", "show"): ["c"],
    ("conversations", "export"): [],
    ("conversations", "delete"): ["c", "--yes"],
    ("limits", "set"): ["--key", "k", "--messages-per-minute", "1"],
    ("limits", "clear"): ["--key", "k"],
    ("limits", "show"): [],
    ("usage",): [],
}
WITHOUT_DATABASE = {
    ("demo-model",): "builds files",
    ("db", "history"): "reads the migration scripts only",
    ("model", "pull"): "the Hub (tests/ops/test_model_pull.py)",
    ("doctor",): "reports every layer itself (tests/ops/test_doctor.py)",
    ("telegram", "set-webhook"): "the Bot API",
    ("telegram", "webhook-info"): "the Bot API",
    ("telegram", "delete-webhook"): "the Bot API",
    ("chat",): "a running service over HTTP",
    ("init",): "writes bot.toml",
    ("slack", "manifest"): "prints a document",
    ("discord", "register-commands"): "the Discord API",
}


def leaf_commands(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(command, click.Group):
        return [
            found
            for name, sub in command.commands.items()
            for found in leaf_commands(sub, (*path, name))
        ]
    return [path]


def test_every_command_is_listed() -> None:
    assert set(leaf_commands(main)) == set(DATABASE_COMMANDS) | set(WITHOUT_DATABASE)


def not_a_folder(tmp_path: Path) -> Path:
    """A path an SQLite file cannot be made under: a file stands where its folder would."""
    path = tmp_path / "not-a-folder"
    path.write_text("")
    return path


def refusing_databases(tmp_path: Path) -> dict[str, str]:
    server = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0].split("://", 1)[1].rpartition("@")[2]
    return {
        "no such database": f"postgresql+asyncpg://postgres:{PASSWORD}@{server}/no_such_db_x",
        "nothing listens": f"postgresql+asyncpg://bot:{PASSWORD}@127.0.0.1:1/bot",
        "a file for a folder": f"sqlite+aiosqlite:///{not_a_folder(tmp_path) / 'bot.db'}",
        "no tables": f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}",
    }


def assert_one_line(output: str) -> None:
    assert "Traceback" not in output, output
    assert PASSWORD not in output, output
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    assert "database" in errors[0] or "no such table" in errors[0], output
    assert "[SQL:" not in output, output


@pytest.mark.parametrize("refusal", ["no such database", "nothing listens", "a file for a folder"])
async def test_every_database_command_answers_a_refusing_database_with_one_line(
    refusal: str, tmp_path: Path
) -> None:
    url = refusing_databases(tmp_path)[refusal]
    for command, args in DATABASE_COMMANDS.items():
        if command == ("db", "downgrade") and refusal != "nothing listens":
            continue  # Alembic would first make the file or find no revision: nothing to undo
        result = await botctl(*command, *args, env={"BOT_DATABASE__URL": url, "BOT_CONFIG": ""})
        assert result.exit_code == 1, (command, result.output)
        assert_one_line(result.output)


async def test_a_database_without_tables_is_one_line_too(tmp_path: Path) -> None:
    url = refusing_databases(tmp_path)["no tables"]
    for command in (("keys", "list"), ("usage",), ("conversations", "list"), ("limits", "show")):
        result = await botctl(*command, env={"BOT_DATABASE__URL": url, "BOT_CONFIG": ""})
        assert result.exit_code == 1, (command, result.output)
        assert_one_line(result.output)


async def test_a_real_process_prints_one_line_and_traceback_on_request(tmp_path: Path) -> None:
    url = refusing_databases(tmp_path)["nothing listens"]
    environment = {**os.environ, "BOT_DATABASE__URL": url, "BOT_CONFIG": ""}

    async def run(*args: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "botctl"),
            *args,
            env=environment,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        async with asyncio.timeout(120):
            output, _ = await process.communicate()
        assert process.returncode is not None
        return process.returncode, output.decode()

    code, output = await run("keys", "list")
    assert code == 1
    assert_one_line(output)
    assert [line for line in output.splitlines() if line.strip()] == [output.strip()]

    code, output = await run("--traceback", "keys", "list")
    assert code == 1 and "Traceback" in output and PASSWORD not in output
