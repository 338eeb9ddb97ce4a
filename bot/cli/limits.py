"""``botctl limits ...``: fair-use limits per API key, platform user or conversation.

The subjects are ``bot.turns.limits``'s.

Overrides live in the database, so every worker applies them at once; a
value not given keeps the subject's current one, ``default`` returns to the
config's ``[limits]`` value, and 0 means no limit.
"""

from __future__ import annotations

import asyncio
import json
import time

import click
from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from bot.cli.common import db_session
from bot.config import Settings, load_settings
from bot.storage.models import ApiKey, LimitOverride
from bot.turns.limits import (
    DAY_S,
    FairUse,
    clear_override,
    conversation_subject,
    key_subject,
    list_overrides,
    set_override,
)

DEFAULT = "default"


def _settings() -> Settings:
    # The root command's context object loads the config (``botctl --config``); read it
    # by attribute so this group does not depend on where that class lives.
    root = click.get_current_context().find_root().obj
    settings = getattr(root, "settings", None)
    return settings if isinstance(settings, Settings) else load_settings(None)


async def _subject(
    session: AsyncSession, key: str | None, user: str | None, conversation: str | None = None
) -> str:
    if sum(given is not None for given in (key, user, conversation)) != 1:
        raise click.UsageError("give exactly one of --key, --user or --conversation")
    if conversation is not None:
        # A channel is KIND:NAME (``webhook:crm``); the id after it may hold colons.
        kind, _, rest = conversation.partition(":")
        name, _, conversation_key = rest.partition(":")
        channel = f"{kind}:{name}"
        if not kind or not name or not conversation_key:
            raise click.UsageError(
                "--conversation is CHANNEL:CONVERSATION_ID, e.g. webhook:crm:ticket-42"
            )
        return conversation_subject(channel, conversation_key)
    if user is not None:
        if user.count(":") < 1:
            raise click.UsageError("--user is CHANNEL:USER_ID, e.g. telegram:support:12345")
        return f"user:{user}"
    assert key is not None
    found = (
        await session.scalars(
            select(ApiKey).where(or_(ApiKey.prefix == key, ApiKey.id == key, ApiKey.name == key))
        )
    ).all()
    if not found:
        raise click.ClickException(f"no API key with prefix, id or name {key!r}")
    if len(found) > 1:
        raise click.ClickException(f"{len(found)} keys are named {key!r}: give the prefix")
    return key_subject(found[0].id)


class _LimitValue(click.ParamType):  # type: ignore[type-arg]
    """A non-negative integer, or ``default``."""

    name = "N|default"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | str:
        text = str(value).strip().lower()
        if text == DEFAULT:
            return DEFAULT
        if text.isdigit():
            return int(text)
        self.fail(f"{value!r} is not a non-negative integer or 'default'", param, ctx)


LIMIT = _LimitValue()
_subject_options = [
    click.option("--key", help="API key prefix, id or name."),
    click.option("--user", help="Platform user as CHANNEL:USER_ID, e.g. telegram:support:42."),
    click.option(
        "--conversation",
        help="A conversation whose messages name no user, as CHANNEL:CONVERSATION_ID, "
        "e.g. webhook:crm:ticket-42.",
    ),
]


def _with_subject(command: click.decorators.FC) -> click.decorators.FC:
    for option in reversed(_subject_options):
        command = option(command)
    return command


@click.group()
def limits() -> None:
    """Fair-use limits: messages per minute and tokens per day.

    \b
    Examples:
      botctl limits show
      botctl limits set --key 3f9a1c2b4d5e --messages-per-minute 10 --tokens-per-day 50000
      botctl limits set --user telegram:support:42 --tokens-per-day default
      botctl limits set --conversation webhook:crm:ticket-42 --messages-per-minute 5
      botctl limits clear --key alice
    """


@limits.command("set")
@_with_subject
@click.option("--messages-per-minute", type=LIMIT, help="N, 0 = unlimited, or 'default'.")
@click.option("--tokens-per-day", type=LIMIT, help="N, 0 = unlimited, or 'default'.")
def limits_set(
    key: str | None,
    user: str | None,
    conversation: str | None,
    messages_per_minute: int | str | None,
    tokens_per_day: int | str | None,
) -> None:
    """Override one subject's limits (values not given stay as they are)."""
    if messages_per_minute is None and tokens_per_day is None:
        raise click.UsageError("give --messages-per-minute and/or --tokens-per-day")
    settings = _settings()

    async def run() -> str:
        async with db_session(settings) as session:
            subject = await _subject(session, key, user, conversation)
            existing = await session.get(LimitOverride, subject)

            def pick(given: int | str | None, now: int | None) -> int | None:
                if given is None:
                    return now
                return None if given == DEFAULT else int(given)

            await set_override(
                session,
                subject,
                messages_per_minute=pick(
                    messages_per_minute, existing.messages_per_minute if existing else None
                ),
                tokens_per_day=pick(tokens_per_day, existing.tokens_per_day if existing else None),
            )
            return subject

    subject = asyncio.run(run())
    click.echo(f"limits set for {subject}", err=True)


@limits.command("clear")
@_with_subject
def limits_clear(key: str | None, user: str | None, conversation: str | None) -> None:
    """Drop a subject's overrides: the config's defaults apply again."""
    settings = _settings()

    async def run() -> tuple[str, bool]:
        async with db_session(settings) as session:
            subject = await _subject(session, key, user, conversation)
            return subject, await clear_override(session, subject)

    subject, cleared = asyncio.run(run())
    click.echo(f"{'cleared' if cleared else 'no overrides for'} {subject}", err=True)


@limits.command("show")
@click.option("--key", help="Only this API key (prefix, id or name).")
@click.option("--user", help="Only this platform user (CHANNEL:USER_ID).")
@click.option("--conversation", help="Only this conversation (CHANNEL:CONVERSATION_ID).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def limits_show(key: str | None, user: str | None, conversation: str | None, as_json: bool) -> None:
    """Defaults, overrides, and today's token use of each overridden (or given) subject."""
    settings = _settings()
    fair_use = FairUse(settings.limits)

    async def run() -> list[dict[str, str | int]]:
        async with db_session(settings) as session:
            if key is not None or user is not None or conversation is not None:
                subjects = [await _subject(session, key, user, conversation)]
            else:
                subjects = [override.subject for override in await list_overrides(session)]
            day = int(time.time() // DAY_S) * DAY_S
            rows: list[dict[str, str | int]] = []
            for subject in subjects:
                standing = await fair_use.standing(await session.connection(), subject, day)
                rows.append(
                    {
                        "subject": subject,
                        "messages_per_minute": standing.limits.messages_per_minute,
                        "tokens_per_day": standing.limits.tokens_per_day,
                        "tokens_used_today": standing.tokens_used,
                    }
                )
        return rows

    subjects = asyncio.run(run())
    defaults = {
        "messages_per_minute": fair_use.defaults.messages_per_minute,
        "tokens_per_day": fair_use.defaults.tokens_per_day,
    }
    if as_json:
        click.echo(json.dumps({"defaults": defaults, "subjects": subjects}))
        return
    click.echo(
        f"default  messages_per_minute={defaults['messages_per_minute']}  "
        f"tokens_per_day={defaults['tokens_per_day']}  (0 = no limit)"
    )
    for row in subjects:
        click.echo(
            f"{row['subject']}  messages_per_minute={row['messages_per_minute']}  "
            f"tokens_per_day={row['tokens_per_day']}  tokens_used_today={row['tokens_used_today']}"
        )
