"""``botctl``: run the service and administer it.

Examples::

    botctl model pull --smollm2    # convert a small real chat model into data/smollm2
    botctl init --model data/smollm2   # write bot.toml, which every later command reads
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

from bot.cli.chat_client import chat
from bot.cli.common import Context, pass_context
from bot.cli.conversations import conversations
from bot.cli.db import db
from bot.cli.discord import discord
from bot.cli.doctor import doctor
from bot.cli.failures import TRACEBACK, Botctl
from bot.cli.init import init
from bot.cli.keys import keys
from bot.cli.limits import limits
from bot.cli.model import model
from bot.cli.slack import slack
from bot.cli.telegram import telegram
from bot.cli.usage import usage
from bot.config import DEFAULT_DEMO_MODEL_DIR

DISTRIBUTION = "llm-chat-bot"
"""The installed distribution whose version ``botctl --version`` prints."""

__all__ = ["Context", "main", "pass_context"]


@click.group(cls=Botctl, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name=DISTRIBUTION, prog_name="botctl")
@click.option(
    "--config",
    "config_path",
    envvar="BOT_CONFIG",
    type=click.Path(dir_okay=False),
    help="TOML config file (default: $BOT_CONFIG, else ./bot.toml if it exists, else built-in"
    " defaults).",
)
@click.option(
    "--traceback",
    "show_traceback",
    is_flag=True,
    help="On a failure, print the traceback (database password masked) before the error.",
)
@click.pass_context
def main(ctx: click.Context, config_path: str | None, show_traceback: bool) -> None:
    """Administer and run the chat bot service.

    Settings come from the TOML file given with --config (or $BOT_CONFIG, else
    ./bot.toml, which `botctl init` and `make run` write), overridden by
    BOT_<SECTION>__<KEY> environment variables. A failure ends a command with one
    line (`Error: ...`) and exit status 1.
    """
    ctx.obj = Context(config_path)
    ctx.meta[TRACEBACK] = show_traceback


@main.command()
@pass_context
def serve(ctx: Context) -> None:
    """Serve the HTTP API and webhooks until SIGTERM, then drain and exit 0.

    Refuses to start on a database with pending migrations. Under systemd
    (Type=notify) it reports READY=1 once the database and the engine answer,
    and pings the watchdog while the engine is healthy. Once the settings are
    loaded, the secrets' BOT_* variables leave its environment: the engine's
    processes do not inherit them.

    \b
    Examples:
      botctl serve
      BOT_SERVER__HOST=0.0.0.0 botctl --config /etc/bot/bot.toml serve
    """
    from bot.config import Settings
    from bot.ops.log import configure_logging
    from bot.secret_files import scrub_process_environment
    from bot.serve import serve as serve_forever
    from bot.storage.migrate import pending_migrations

    settings = ctx.settings
    # Loaded: what the service starts from here on (vLLM's engine processes) inherits
    # its environment, and needs none of its secrets.
    scrub_process_environment(Settings)
    configure_logging(settings.logging.level, settings.logging.format)
    pending = asyncio.run(pending_migrations(settings.database.url))
    if pending:
        raise click.ClickException(
            "the database has pending migrations: run `botctl db upgrade` first"
        )
    from bot.turns.claims import AlreadyRunning, single_process_guard

    try:
        lock = single_process_guard(settings.database.url)  # held until the process exits
    except AlreadyRunning as exc:
        raise click.ClickException(str(exc)) from exc
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
    from bot.models.demo_model import build_demo_model

    click.echo(f"building demo model in {path} ...", err=True)
    build_demo_model(path)
    click.echo(str(path))


COMMANDS: tuple[click.Command, ...] = (
    init,
    db,
    keys,
    model,
    conversations,
    doctor,
    telegram,
    slack,
    discord,
    limits,
    usage,
    chat,
)
"""Every command group but the two defined above (``serve``, ``demo-model``)."""

for command in COMMANDS:
    main.add_command(command)
