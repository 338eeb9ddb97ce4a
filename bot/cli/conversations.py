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
    find_conversations,
    list_conversations,
    load_conversation,
    selected_ids,
)
from bot.cli.common import Context, aligned, db_sessionmakers, pass_context
from bot.storage.models import Conversation


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
      botctl conversations show trip                     # turns and messages of 'trip'
      botctl conversations show chat:42 --channel telegram:support
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
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    if not rows:
        click.echo("no conversations match", err=True)
        return
    table = [
        {
            "key": str(row["external_key"]),
            "owner": str(row["owner"]),
            "channel": str(row["channel"]),
            "turns": str(row["turns"]),
            "state": "closed" if row["closed_at"] else "open",
            "updated": str(row["updated_at"]),
            "id": str(row["id"]),
        }
        for row in rows
    ]
    for line in aligned(table):
        click.echo(line)


@conversations.command("show")
@click.argument("conversation")
@click.option("--owner", help="The owner (tenant), when the id is used by several.")
@click.option("--channel", help="The channel (api, telegram:support ...), when several use it.")
@pass_context
def conversations_show(
    ctx: Context, conversation: str, owner: str | None, channel: str | None
) -> None:
    """Show one conversation's turns (status, usage, error) and messages as JSON.

    CONVERSATION is the id the user knows (the HTTP API's conversation_id, a
    channel key such as chat:42 from `conversations list`) or the internal id.
    When the user started over (/new), the newest conversation under that id is
    shown.
    """

    async def run() -> tuple[list[Conversation], dict[str, Any] | None]:
        async with db_sessionmakers(ctx.settings) as (_, read), read() as session:
            found = await find_conversations(session, conversation, owner=owner, channel=channel)
            owners = {(row.owner, row.channel) for row in found}
            if len(owners) != 1:
                return found, None
            return found, await load_conversation(session, found[0].id)

    found, document = asyncio.run(run())
    if not found:
        raise click.ClickException(
            f"no conversation {conversation!r}"
            + (" for that owner/channel" if owner or channel else "")
            + "; `botctl conversations list` shows them"
        )
    if document is None:
        places = "; ".join(sorted({f"--owner {r.owner} --channel {r.channel}" for r in found}))
        raise click.ClickException(
            f"{conversation!r} names conversations of several owners or channels: "
            f"add one of: {places}"
        )
    if len(found) > 1:
        click.echo(
            f"the newest of {len(found)} conversations under {conversation!r} "
            f"(`botctl conversations list --key {conversation}` lists them all)",
            err=True,
        )
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
