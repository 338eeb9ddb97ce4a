"""``botctl``: run the service and administer it.

Examples::

    botctl model pull --smollm2    # convert a small real chat model into data/smollm2
    botctl demo-model              # build the offline demo model into data/demo-model
    botctl db upgrade              # create or migrate the database
    botctl keys create alice       # print a new API key, once
    botctl usage --days 30         # turns and tokens per day, owner and channel
    botctl doctor                  # check every layer, stop at the first broken one
    botctl serve                   # serve on 127.0.0.1:8080

Each command group lives in its own module of this package (the Telegram
commands in their channel's folder) and is mounted from one list, ``COMMANDS``;
what the commands do lives beside them, in ``bot.admin`` and the packages they
administer.

Shell completion is click's own: ``eval "$(_BOTCTL_COMPLETE=bash_source botctl)"``
(``zsh_source``, ``fish_source`` for the other shells).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from bot.chat_client import chat
from bot.cli.common import Context, database_password_masked, pass_context
from bot.cli.conversations import conversations
from bot.cli.db import db
from bot.cli.discord import discord
from bot.cli.doctor import doctor
from bot.cli.keys import keys
from bot.cli.limits import limits
from bot.cli.model import model
from bot.cli.telegram import telegram
from bot.cli.usage import usage
from bot.config import DEFAULT_DEMO_MODEL_DIR

DISTRIBUTION = "llm-chat-bot"
"""The installed distribution whose version ``botctl --version`` prints."""

__all__ = ["Context", "main", "pass_context"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name=DISTRIBUTION, prog_name="botctl")
@click.option(
    "--config",
    "config_path",
    envvar="BOT_CONFIG",
    type=click.Path(dir_okay=False),
    help="TOML config file (default: $BOT_CONFIG, else built-in defaults).",
)
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Administer and run the chat bot service.

    Settings come from the TOML file given with --config (or $BOT_CONFIG),
    overridden by BOT_<SECTION>__<KEY> environment variables.
    """
    ctx.obj = Context(config_path)


@main.command()
@pass_context
def serve(ctx: Context) -> None:
    """Serve the HTTP API and webhooks until SIGTERM, then drain and exit 0.

    Refuses to start on a database with pending migrations. Under systemd
    (Type=notify) it reports READY=1 once the database and the engine answer,
    and pings the watchdog while the engine is healthy.

    \b
    Examples:
      botctl serve
      BOT_SERVER__HOST=0.0.0.0 botctl --config /etc/bot/bot.toml serve
    """
    from bot.log import configure_logging
    from bot.serve import serve as serve_forever
    from bot.storage.migrate import pending_migrations

    settings = ctx.settings
    configure_logging(settings.logging.level, settings.logging.format)
    url = settings.database.url
    with database_password_masked(url):
        pending = asyncio.run(pending_migrations(url))
    if pending:
        raise click.ClickException(
            "the database has pending migrations: run `botctl db upgrade` first"
        )
    from bot.turns.claims import AlreadyRunning, single_process_guard

    try:
        lock = single_process_guard(settings.database.url)  # held until the process exits
    except AlreadyRunning as exc:
        raise click.ClickException(str(exc)) from exc
    with database_password_masked(url, show_traceback=True):
        code = asyncio.run(serve_forever(settings))
    del lock
    sys.exit(code)


@main.command("demo-model")
@click.option(
    "--path",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DEMO_MODEL_DIR,
    show_default=True,
    help="Folder to write the model into.",
)
def demo_model(path: Path) -> None:
    """Build the tiny offline demo model (random weights: it babbles).

    \b
    Example:
      botctl demo-model --path /var/lib/bot/demo-model
    """
    from bot.demo_model import build_demo_model

    click.echo(f"building demo model in {path} ...", err=True)
    build_demo_model(path)
    click.echo(str(path))


COMMANDS: tuple[click.Command, ...] = (
    db,
    keys,
    model,
    conversations,
    doctor,
    telegram,
    discord,
    limits,
    usage,
    chat,
)
"""Every command group but the two defined above (``serve``, ``demo-model``)."""

for command in COMMANDS:
    main.add_command(command)
