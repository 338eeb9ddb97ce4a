"""What every ``botctl`` command shares: the loaded settings, a database session, durations.

Command modules (``bot.cli.keys``, ``bot.cli.db``, ...) each define one click
group and take the settings through ``pass_context``; ``bot.cli`` mounts them.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import click
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.config import ConfigError, Settings, find_config, load_settings

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Context:
    """The root ``ctx.obj``: the config file every command reads (``--config``, else
    ``$BOT_CONFIG``, else ``./bot.toml``), and the settings loaded on first use."""

    def __init__(self, config_path: str | None) -> None:
        found = find_config(config_path)
        self.config_path = None if found is None else str(found)
        self._settings: Settings | None = None

    @property
    def loaded_settings(self) -> Settings | None:
        """The settings if a command has loaded them (``bot.cli.failures`` masks their
        database password), else None."""
        return self._settings

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            try:
                self._settings = load_settings(self.config_path)
            except ConfigError as exc:
                raise click.ClickException(str(exc)) from exc
        return self._settings


pass_context = click.make_pass_decorator(Context)


def parse_duration(text: str) -> dt.timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` -> timedelta."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 30d, 12h, 90m, 45s or 2w")
    return dt.timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])


class DurationType(click.ParamType):  # type: ignore[type-arg]
    name = "duration"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.timedelta:
        if isinstance(value, dt.timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()


@asynccontextmanager
async def db_session(settings: Settings) -> AsyncIterator[AsyncSession]:
    """One session on a short-lived engine, committed on success (CLI commands are one-shot)."""
    from bot.storage.db import create_engine, create_sessionmaker

    engine = create_engine(settings.database.url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            yield session
    finally:
        await engine.dispose()


@asynccontextmanager
async def db_sessionmakers(
    settings: Settings,
) -> AsyncIterator[tuple[async_sessionmaker[AsyncSession], async_sessionmaker[AsyncSession]]]:
    """(read-write, read-only) session factories on a short-lived engine, for commands that
    work in many short transactions on a live database (``botctl conversations``)."""
    from bot.storage.db import create_engine, create_read_sessionmaker, create_sessionmaker

    engine = create_engine(settings.database.url)
    try:
        yield create_sessionmaker(engine), create_read_sessionmaker(engine)
    finally:
        await engine.dispose()


def aligned(rows: list[dict[str, str]]) -> list[str]:
    """A table for people: a header line of the column names, then one line per row."""
    columns = list(rows[0])
    widths = {col: max(len(col), *(len(row[col]) for row in rows)) for col in columns}
    lines = ["  ".join(col.upper().ljust(widths[col]) for col in columns).rstrip()]
    lines += ["  ".join(row[col].ljust(widths[col]) for col in columns).rstrip() for row in rows]
    return lines


def format_time(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    from bot.storage.models import as_utc

    return as_utc(value).strftime("%Y-%m-%d %H:%M:%SZ")
