"""``botctl``: run the service and administer it.

Examples::

    botctl demo-model              # build the offline demo model into data/demo-model
    botctl db upgrade              # create or migrate the database
    botctl keys create alice       # print a new API key, once
    botctl serve                   # serve on 127.0.0.1:8080
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click

from bot.config import DEFAULT_DEMO_MODEL_DIR, ConfigError, Settings, load_settings


class Context:
    def __init__(self, config_path: str | None) -> None:
        self.config_path = config_path
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            try:
                self._settings = load_settings(self.config_path)
            except ConfigError as exc:
                raise click.ClickException(str(exc)) from exc
        return self._settings


pass_context = click.make_pass_decorator(Context)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    envvar="BOT_CONFIG",
    type=click.Path(dir_okay=False),
    help="TOML config file (default: $BOT_CONFIG, else built-in defaults).",
)
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Administer and run the chat bot service."""
    ctx.obj = Context(config_path)


@main.command()
@pass_context
def serve(ctx: Context) -> None:
    """Serve the HTTP API and webhooks (refuses to start on an unmigrated database)."""
    from aiohttp import web

    from bot.http.app import create_app
    from bot.log import configure_logging
    from bot.storage.migrate import pending_migrations

    settings = ctx.settings
    configure_logging(settings.logging.level, settings.logging.format)
    if asyncio.run(pending_migrations(settings.database.url)):
        raise click.ClickException(
            "the database has pending migrations: run `botctl db upgrade` first"
        )
    web.run_app(
        create_app(settings),
        host=settings.server.host,
        port=settings.server.port,
        print=None,
        access_log=None,
        shutdown_timeout=settings.server.shutdown_grace_s + 5,
    )


@main.command("demo-model")
@click.option(
    "--path",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DEMO_MODEL_DIR,
    show_default=True,
    help="Folder to write the model into.",
)
def demo_model(path: Path) -> None:
    """Build the tiny offline demo model (random weights: it babbles)."""
    from bot.demo_model import build_demo_model

    click.echo(f"building demo model in {path} ...", err=True)
    build_demo_model(path)
    click.echo(str(path))


@main.group()
def db() -> None:
    """Database migrations (Alembic)."""


@db.command("upgrade")
@click.argument("revision", default="head")
@pass_context
def db_upgrade(ctx: Context, revision: str) -> None:
    """Migrate the database up to REVISION (default: head)."""
    from bot.storage.migrate import upgrade

    upgrade(ctx.settings.database.url, revision)
    click.echo(f"database at {revision}", err=True)


@db.command("current")
@pass_context
def db_current(ctx: Context) -> None:
    """Print the database's current revision."""
    from bot.storage.migrate import current_revision

    click.echo(asyncio.run(current_revision(ctx.settings.database.url)) or "(empty)")


@main.group()
def keys() -> None:
    """API keys."""


@keys.command("create")
@click.argument("name")
@click.option("--owner", help="Tenant the key acts for (default: NAME).")
@click.option(
    "--scope", "scopes", multiple=True, type=click.Choice(["chat", "admin"]), default=["chat"]
)
@pass_context
def keys_create(ctx: Context, name: str, owner: str | None, scopes: tuple[str, ...]) -> None:
    """Create a key and print it once (it is stored hashed)."""
    key = asyncio.run(_create_key(ctx.settings, name, owner, scopes))
    click.echo(key)


async def _create_key(settings: Settings, name: str, owner: str | None, scopes: Any) -> str:
    from bot.apikeys import create_key
    from bot.storage.db import create_engine, create_sessionmaker

    engine = create_engine(settings.database.url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            issued = await create_key(session, name=name, owner=owner, scopes=tuple(scopes))
        return issued.key
    finally:
        await engine.dispose()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
