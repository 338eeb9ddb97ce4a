"""Alembic, driven from Python: ``botctl db ...`` and the start-up check use this."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from bot.storage.db import create_engine

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Options go through ConfigParser interpolation: a percent-encoded password
    # (p%40ss) would raise with the whole URL in the message. %% reads back as %.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


def head_revision(database_url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()


async def current_revision(database_url: str) -> str | None:
    def _read(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    engine = create_engine(database_url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(_read)
    finally:
        await engine.dispose()


async def pending_migrations(database_url: str) -> bool:
    """True when the database is not at the newest revision."""
    current = await current_revision(database_url)
    return current != await asyncio.to_thread(head_revision, database_url)
