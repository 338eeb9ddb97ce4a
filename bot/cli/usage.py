"""``botctl usage``: turns and tokens per UTC day, owner and channel (``bot.turns.usage``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time

import click

from bot.cli.common import Context, db_sessionmakers, pass_context
from bot.turns.usage import UsageQuery, UsageReports, UsageRow, cache_share, utc_day

DEFAULT_DAYS = 7
_COLUMNS = (
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
)


def _share(cached: int, prompt: int) -> str:
    share = cache_share(cached, prompt)
    return "-" if share is None else f"{share:.0%}"


def _cells(row: UsageRow) -> tuple[str, ...]:
    return (
        row.day.isoformat(),
        row.owner,
        row.channel,
        str(row.turns_done),
        str(row.turns_failed),
        str(row.turns_stopped),
        str(row.prompt_tokens),
        str(row.cached_tokens),
        str(row.completion_tokens),
        _share(row.cached_tokens, row.prompt_tokens),
    )


def format_table(rows: list[UsageRow]) -> str:
    """Aligned columns, text left and numbers right, and a total line."""
    prompt = sum(r.prompt_tokens for r in rows)
    cached = sum(r.cached_tokens for r in rows)
    total = (
        "total",
        "",
        "",
        str(sum(r.turns_done for r in rows)),
        str(sum(r.turns_failed for r in rows)),
        str(sum(r.turns_stopped for r in rows)),
        str(prompt),
        str(cached),
        str(sum(r.completion_tokens for r in rows)),
        _share(cached, prompt),
    )
    lines = [_COLUMNS, *(_cells(r) for r in rows), total]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if i < 3 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )


@click.command()
@click.option(
    "--owner",
    help="Only this owner: key:OWNER (an API key's), telegram:BOT, webhook:NAME, a Slack team id.",
)
@click.option("--channel", help="Only this channel: api, openai, telegram:BOT, slack:APP.")
@click.option(
    "--since",
    type=click.DateTime(formats=["%Y-%m-%d"]),
    help="From this UTC day on (YYYY-MM-DD).",
)
@click.option(
    "--days",
    type=click.IntRange(min=1),
    help=f"Today and the days before it, this many in all (default {DEFAULT_DAYS}).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@pass_context
def usage(
    ctx: Context,
    owner: str | None,
    channel: str | None,
    since: dt.datetime | None,
    days: int | None,
    as_json: bool,
) -> None:
    """Turns (done, failed, stopped) and tokens (prompt, cached, completion) per day,
    owner and channel.

    Days are UTC calendar days of each turn's arrival. "cache" is the share of
    prompt tokens vLLM served from its prefix cache. Reads only: on SQLite it
    never takes the write lock, so it is safe against a live service.

    \b
    Examples:
      botctl usage                        # the last 7 days
      botctl usage --days 30 --owner key:alice
      botctl usage --channel telegram:support --since 2026-03-01 --json
    """
    if since is not None and days is not None:
        raise click.UsageError("give --since or --days, not both")
    if since is not None:
        start = since.replace(tzinfo=dt.UTC)
    else:
        _, today = utc_day(time.time())
        start = today - dt.timedelta(days=(days or DEFAULT_DAYS) - 1)

    async def run() -> list[UsageRow]:
        async with db_sessionmakers(ctx.settings) as (_, read):
            return await UsageReports(read, None).rows(
                UsageQuery(owner=owner, channels=(channel,) if channel else (), since=start)
            )

    rows = asyncio.run(run())
    if as_json:
        for row in rows:
            click.echo(json.dumps(row.as_dict(), ensure_ascii=False))
        return
    if not rows:
        click.echo(f"no turns since {start.date().isoformat()} (UTC)", err=True)
        return
    click.echo(format_table(rows))
