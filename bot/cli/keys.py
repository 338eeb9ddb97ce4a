"""``botctl keys ...``: create, list, revoke and rotate API keys.

Keys are stored hashed: ``create`` and ``rotate`` print the new key once, on
stdout (everything else goes to stderr, so ``key=$(botctl keys create x)`` works).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import click

from bot.admin.keys import KeyInfo, issue_key, list_keys, revoke_key, rotate_key
from bot.apikeys import SCOPES
from bot.cli.common import DURATION, Context, aligned, db_session, format_time, pass_context


def _fail_on_lookup(exc: LookupError) -> click.ClickException:
    return click.ClickException(str(exc.args[0] if exc.args else exc))


@click.group()
def keys() -> None:
    """API keys (stored hashed; shown once).

    \b
    Examples:
      botctl keys create alice                         # chat key, no expiry
      botctl keys create ops --scope admin --expires 30d
      botctl keys list
      botctl keys rotate 3f9a1c2b4d5e --overlap 1h     # old key works one more hour
      botctl keys revoke 3f9a1c2b4d5e
    """


@keys.command("create")
@click.argument("name")
@click.option(
    "--owner",
    help="Who the key acts for (default: NAME); its conversations are stored under key:OWNER.",
)
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(SCOPES),
    default=["chat"],
    show_default=True,
    help="Repeat for several: --scope chat --scope admin.",
)
@click.option("--expires", type=DURATION, help="Lifetime, e.g. 30d, 12h, 2w (default: never).")
@click.option(
    "--allow-duplicate",
    is_flag=True,
    help="Create it even though a live key has the same name.",
)
@pass_context
def keys_create(
    ctx: Context,
    name: str,
    owner: str | None,
    scopes: tuple[str, ...],
    expires: dt.timedelta | None,
    allow_duplicate: bool,
) -> None:
    """Create a key and print it once. A name a live key has is refused (--allow-duplicate)."""

    async def run() -> str:
        async with db_session(ctx.settings) as session:
            issued = await issue_key(
                session,
                name=name,
                owner=owner,
                scopes=scopes,
                expires_in=expires,
                allow_duplicate=allow_duplicate,
            )
            return issued.key

    try:
        key = asyncio.run(run())
    except ValueError as exc:  # a live key's name, or an owner no key may have
        raise click.ClickException(str(exc)) from None
    click.echo(key)
    click.echo(
        f"created key {name!r} (prefix {key.split('_')[1]}); store it now, it is not shown again",
        err=True,
    )


def _row(info: KeyInfo) -> dict[str, str]:
    return {
        "name": info.name,
        "prefix": info.prefix,
        "owner": info.owner,
        "scopes": ",".join(info.scopes),
        "created": format_time(info.created_at),
        "last_used": format_time(info.last_used_at),
        "expires": format_time(info.expires_at),
        "state": info.state,
    }


@keys.command("list")
@click.option("--active", is_flag=True, help="Only keys that work now.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@pass_context
def keys_list(ctx: Context, active: bool, as_json: bool) -> None:
    """List keys: name, prefix, owner, scopes, created, last used, expiry, state (never the key)."""

    async def run() -> list[KeyInfo]:
        async with db_session(ctx.settings) as session:
            return await list_keys(session, include_inactive=not active)

    rows = [_row(info) for info in asyncio.run(run())]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    if not rows:
        click.echo("no keys; create one with `botctl keys create NAME`", err=True)
        return
    for line in aligned(rows):
        click.echo(line)


@keys.command("revoke")
@click.argument("key_ref", metavar="KEY")
@pass_context
def keys_revoke(ctx: Context, key_ref: str) -> None:
    """Revoke KEY (prefix, id or unique name): it gets 401 from the next request on."""

    async def run() -> KeyInfo:
        async with db_session(ctx.settings) as session:
            return await revoke_key(session, key_ref)

    try:
        info = asyncio.run(run())
    except LookupError as exc:
        raise _fail_on_lookup(exc) from None
    click.echo(f"revoked key {info.name!r} (prefix {info.prefix})", err=True)


@keys.command("rotate")
@click.argument("key_ref", metavar="KEY")
@click.option(
    "--overlap",
    type=DURATION,
    help="Keep the old key working this long (e.g. 1h) instead of revoking it at once.",
)
@pass_context
def keys_rotate(ctx: Context, key_ref: str, overlap: dt.timedelta | None) -> None:
    """Replace KEY with a new one (same name, owner, scopes, lifetime); print the new key once."""

    async def run() -> tuple[KeyInfo, str]:
        async with db_session(ctx.settings) as session:
            old, issued = await rotate_key(session, key_ref, overlap=overlap)
            return old, issued.key

    try:
        old, key = asyncio.run(run())
    except LookupError as exc:
        raise _fail_on_lookup(exc) from None
    click.echo(key)
    retired = f"works until {format_time(old.expires_at)}" if overlap else "is revoked"
    click.echo(f"rotated key {old.name!r}: old prefix {old.prefix} {retired}", err=True)
