"""``botctl init``: write a starter ``bot.toml``, the file every later ``botctl`` finds.

``make run`` calls it once, naming the model it serves and the database, so that
``botctl doctor``, ``botctl keys`` and the rest see the settings ``serve`` runs
with (``bot.config.find_config``), rather than each command its own defaults.
It never overwrites a file: a config someone edited is theirs.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import click

from bot.config import DEFAULT_CONFIG_FILE, DEFAULT_DATABASE_URL, ConfigError, load_settings
from bot.storage.redact import hide_password

HEADER = """\
# The service's settings; every `botctl` command run in this folder reads this file
# (unless --config or BOT_CONFIG names another). Written once by `botctl init`
# (`make run` runs it); edit it freely. Every key with its default and what it
# does: config.example.toml. BOT_<SECTION>__<KEY> environment variables override
# any key here (BOT_ENGINE__MODEL=..., BOT_DATABASE__URL=...).
"""


def starter_config(model: str, database_url: str) -> str:
    """The text of a starter config naming ``model`` and ``database_url``."""

    def quoted(value: str) -> str:
        # A JSON string is a valid TOML basic string (the same escapes).
        return json.dumps(value, ensure_ascii=False)

    return (
        f"{HEADER}\n"
        f"[database]\nurl = {quoted(database_url)}\n\n"
        f"[engine]\n"
        f"# A local model folder or a Hugging Face id (`botctl model pull ID` prepares one).\n"
        f"model = {quoted(model)}\n"
    )


@click.command("init")
@click.option(
    "--model",
    required=True,
    help="The model to serve: a local folder (data/smollm2) or a Hugging Face id.",
)
@click.option(
    "--database",
    "database_url",
    default=DEFAULT_DATABASE_URL,
    show_default=True,
    help="Database URL (SQLite file or postgresql+asyncpg://...).",
)
@click.option(
    "--path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_CONFIG_FILE,
    show_default=True,
    help="File to write; an existing one is left as it is.",
)
def init(model: str, database_url: str, path: Path) -> None:
    """Write a starter config naming the model and the database, once.

    \b
    Examples:
      botctl init --model data/smollm2
      botctl init --model Qwen/Qwen2.5-0.5B-Instruct --database postgresql+asyncpg://bot@db/bot
    """
    if path.exists():
        click.echo(f"{path} exists: left as it is", err=True)
        return
    text = starter_config(model, database_url)
    scratch = path.with_name(f".{path.name}.new")
    scratch.write_text(text, encoding="utf-8")
    try:
        # Checked as the service will read it, before it takes the real name.
        tomllib.loads(text)
        load_settings(scratch)
    except ConfigError as exc:
        scratch.unlink()
        raise click.ClickException(str(exc)) from None
    scratch.replace(path)
    click.echo(f"wrote {path}: model {model}, database {hide_password(database_url)}", err=True)
