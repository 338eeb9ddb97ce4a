"""``botctl db ...``: schema migrations on Alembic."""

from __future__ import annotations

import asyncio
import json

import click

from bot.cli.common import Context, pass_context


@click.group()
def db() -> None:
    """Database migrations (Alembic).

    \b
    Examples:
      botctl db upgrade            # create or migrate the database to the newest schema
      botctl db check              # exit 1 when migrations are pending
      botctl db current
      botctl db history
      botctl db downgrade 0001     # back to revision 0001 (asks first)
    """


@db.command("upgrade")
@click.argument("revision", default="head")
@pass_context
def db_upgrade(ctx: Context, revision: str) -> None:
    """Migrate the database up to REVISION (default: head)."""
    from bot.storage.migrate import current_revision, upgrade

    url = ctx.settings.database.url
    click.echo(f"migrating the database to {revision} ...", err=True)
    upgrade(url, revision)
    click.echo(f"database at {asyncio.run(current_revision(url)) or '(empty)'}", err=True)


@db.command("downgrade")
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_context
def db_downgrade(ctx: Context, revision: str, yes: bool) -> None:
    """Migrate the database down to REVISION (``base`` drops every table: data is lost)."""
    from bot.storage.migrate import current_revision, downgrade

    url = ctx.settings.database.url
    if not yes:
        click.confirm(
            f"downgrade the database to {revision}? data in dropped tables is lost", abort=True
        )
    downgrade(url, revision)
    click.echo(f"database at {asyncio.run(current_revision(url)) or '(empty)'}", err=True)


@db.command("current")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: revision, head.")
@pass_context
def db_current(ctx: Context, as_json: bool) -> None:
    """Print the database's current revision ("(empty)" before the first upgrade)."""
    from bot.storage.migrate import current_revision, head_revision

    url = ctx.settings.database.url
    current = asyncio.run(current_revision(url))
    if as_json:
        head = head_revision(url)
        click.echo(json.dumps({"revision": current, "head": head, "up_to_date": current == head}))
        return
    click.echo(current or "(empty)")


@db.command("history")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per revision and line.")
@pass_context
def db_history(ctx: Context, as_json: bool) -> None:
    """List the revisions, oldest first; the database's current one is marked."""
    from alembic.script import ScriptDirectory

    from bot.storage.migrate import alembic_config, current_revision

    url = ctx.settings.database.url
    current = asyncio.run(current_revision(url))
    script = ScriptDirectory.from_config(alembic_config(url))
    for revision in reversed(list(script.walk_revisions())):
        doc = (revision.doc or "").strip()
        if as_json:
            row = {
                "revision": revision.revision,
                "down_revision": revision.down_revision,
                "doc": doc,
                "current": revision.revision == current,
            }
            click.echo(json.dumps(row))
            continue
        mark = "*" if revision.revision == current else " "
        click.echo(f"{mark} {revision.revision}  {doc}")


@db.command("check")
@pass_context
def db_check(ctx: Context) -> None:
    """Exit 0 when the database is at the newest revision, else 1 naming the command to run."""
    from bot.storage.migrate import current_revision, head_revision

    url = ctx.settings.database.url
    current = asyncio.run(current_revision(url))
    head = head_revision(url)
    if current != head:
        click.echo(
            f"pending migrations: database at {current or '(empty)'}, newest is {head}; "
            "run `botctl db upgrade`",
            err=True,
        )
        raise SystemExit(1)
    click.echo(f"database at {head}: up to date", err=True)
