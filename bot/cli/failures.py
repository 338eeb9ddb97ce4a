"""How a ``botctl`` command ends when what it drives fails: one line and exit status 1.

Every command runs under ``Botctl`` (the root group, ``bot.cli.main``), so no
command can forget this: an exception that is not click's own ends the command
with ``Error: <what failed>: <why>`` on one line, never a traceback. A database
that refuses or does not answer, a statement it rejects, an engine that will not
start, a model folder that is not there: the operator reads what failed and
where to look, not forty lines of library frames.

The line is the exception's first line only: SQLAlchemy puts the statement and
its parameters (users' text, keys' hashes) on the lines after it. The database
URL's password is masked in every form (``bot.storage.redact``).
``botctl --traceback ...`` prints the masked traceback first, for a bug report.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import click
import sqlalchemy.exc

from bot.errors import BotError
from bot.storage.db import storage_unavailable
from bot.storage.redact import redact

_MAX_CHARS = 500
"""A message longer than this is cut: one line an operator can read."""


def what_failed(exc: BaseException) -> str:
    """The part of the service ``exc`` came from, in the operator's words."""
    if storage_unavailable(exc):
        return "the database did not answer"
    if isinstance(exc, sqlalchemy.exc.SQLAlchemyError):
        return "the database refused"
    if isinstance(exc, BotError):
        return "the engine failed"
    if isinstance(exc, OSError):
        return "a file or connection failed"
    return "the command failed"


def one_line(exc: BaseException, url: str) -> str:
    """``<what failed>: <Type>: <first line of the message>``, password masked."""
    orig = getattr(exc, "orig", None)  # SQLAlchemy's wrapper: the driver's own error says it
    cause = orig if isinstance(orig, BaseException) else exc
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    message = lines[0] if lines else ""
    text = f"{type(cause).__name__}: {message}" if message else type(cause).__name__
    if len(text) > _MAX_CHARS:
        text = text[: _MAX_CHARS - 1] + "…"
    return redact(f"{what_failed(exc)}: {text}", url)


class Botctl(click.Group):
    """The root group: every command's unexpected failure becomes one line (``one_line``)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            url, show_traceback = _database_url(ctx), bool(ctx.meta.get(TRACEBACK))
            if show_traceback:
                print(redact("".join(traceback.format_exception(exc)), url), file=sys.stderr)
            raise click.ClickException(one_line(exc, url)) from None


TRACEBACK = "botctl.traceback"
"""``ctx.meta`` key: ``botctl --traceback`` was given."""


def _database_url(ctx: click.Context) -> str:
    """The configured database URL, if the command got as far as loading the settings."""
    loaded = getattr(ctx.obj, "loaded_settings", None)
    database = getattr(loaded, "database", None)
    url = getattr(database, "url", "")
    return url if isinstance(url, str) else ""
