"""``botctl conversations ...``: list, show, export (JSON Lines) and delete conversations."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import IO, Any

import click

from bot.admin.conversations import (
    Removed,
    Selector,
    delete_conversations,
    export_conversations,
    list_conversations,
    load_conversation,
    selected_ids,
)
from bot.cli.common import Context, db_sessionmakers, pass_context


def _selector_options(function: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--owner",
                help="Only this owner's (tenant's) conversations: key:OWNER for an API key's.",
            ),
            click.option("--channel", help="Only this channel, e.g. api, telegram:support."),
            click.option(
                "--key", "external_key", help="Only this conversation key of the channel."
            ),
        ]
    ):
        function = option(function)
    return function


@click.group()
def conversations() -> None:
    """Conversations: inspect, export, erase.

    \b
    Examples:
      botctl conversations list --owner key:alice
      botctl conversations show 3f1c...                  # turns and messages
      botctl conversations export --owner key:alice -o alice.jsonl
      botctl conversations delete --owner key:alice --yes    # right to be forgotten
    """


@conversations.command("list")
@_selector_options
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@pass_context
def conversations_list(
    ctx: Context,
    owner: str | None,
    channel: str | None,
    external_key: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List conversations, most recently active first."""

    async def run() -> list[dict[str, Any]]:
        async with db_sessionmakers(ctx.settings) as (_, read), read() as session:
            return await list_conversations(
                session, Selector((), owner, channel, external_key), limit=limit
            )

    rows = asyncio.run(run())
    for row in rows:
        if as_json:
            click.echo(json.dumps(row))
        else:
            state = "closed" if row["closed_at"] else "open"
            click.echo(
                f"{row['id']}  {row['owner']}  {row['channel']}  {row['external_key']}  "
                f"turns={row['turns']}  {state}  updated {row['updated_at']}"
            )
    if not rows and not as_json:
        click.echo("no conversations match", err=True)


@conversations.command("show")
@click.argument("conversation_id")
@pass_context
def conversations_show(ctx: Context, conversation_id: str) -> None:
    """Show one conversation's turns (status, usage, error) as JSON."""

    async def run() -> dict[str, Any] | None:
        async with db_sessionmakers(ctx.settings) as (_, read), read() as session:
            return await load_conversation(session, conversation_id)

    document = asyncio.run(run())
    if document is None:
        raise click.ClickException(f"no conversation {conversation_id!r}")
    click.echo(json.dumps(document, indent=2, ensure_ascii=False))


@conversations.command("export")
@click.argument("conversation_ids", nargs=-1)
@_selector_options
@click.option(
    "-o",
    "--output",
    type=click.File("w", encoding="utf-8"),
    default="-",
    help="File to write (default: stdout).",
)
@pass_context
def conversations_export(
    ctx: Context,
    conversation_ids: tuple[str, ...],
    owner: str | None,
    channel: str | None,
    external_key: str | None,
    output: IO[str],
) -> None:
    """Export conversations as JSON Lines: one conversation (turns, messages) per line.

    With no ids and no filter, exports every conversation.
    """
    selector = Selector(conversation_ids, owner, channel, external_key)

    async def run() -> int:
        async with db_sessionmakers(ctx.settings) as (_, read):
            async with read() as session:
                ids = await selected_ids(session, selector)
            documents = export_conversations(read, ids)
            # A bar on a terminal only: in logs and pipes an export stays quiet.
            with (
                click.progressbar(length=len(ids), label="exporting", file=sys.stderr)
                if sys.stderr.isatty()
                else _NoBar() as bar
            ):
                async for document in documents:
                    output.write(json.dumps(document, ensure_ascii=False) + "\n")
                    bar.update(1)
            return len(ids)

    count = asyncio.run(run())
    click.echo(f"exported {count} conversation(s)", err=True)


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def update(self, _steps: int) -> None:
        return None


@conversations.command("delete")
@click.argument("conversation_ids", nargs=-1)
@_selector_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_context
def conversations_delete(
    ctx: Context,
    conversation_ids: tuple[str, ...],
    owner: str | None,
    channel: str | None,
    external_key: str | None,
    yes: bool,
) -> None:
    """Erase conversations with their messages, turns and inbound events; print what went.

    Select by ids and/or --owner/--channel/--key; at least one is required.
    """
    selector = Selector(conversation_ids, owner, channel, external_key)
    if selector.is_empty:
        raise click.UsageError("name conversation ids or a filter (--owner, --channel, --key)")

    async def count() -> list[str]:
        async with db_sessionmakers(ctx.settings) as (_, read), read() as session:
            return await selected_ids(session, selector)

    async def run(ids: list[str]) -> Removed:
        async with db_sessionmakers(ctx.settings) as (sessions, _):
            return await delete_conversations(sessions, ids)

    ids = asyncio.run(count())
    if not ids:
        raise click.ClickException("no conversations match")
    if not yes:
        click.confirm(f"erase {len(ids)} conversation(s) and all their messages?", abort=True)
    removed = asyncio.run(run(ids))
    click.echo(
        json.dumps(
            {
                "deleted": {
                    "conversations": removed.conversations,
                    "turns": removed.turns,
                    "messages": removed.messages,
                    "inbound_events": removed.inbound_events,
                }
            }
        )
    )
