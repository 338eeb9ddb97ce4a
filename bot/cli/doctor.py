"""``botctl doctor``: find the broken layer in one command."""

from __future__ import annotations

import asyncio
import sys

import click

from bot.cli.common import Context
from bot.doctor import CheckResult, render_json, render_text, run_doctor

SKIPPABLE = ("engine", "platforms")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per layer, for machines.")
@click.option(
    "--skip",
    multiple=True,
    type=click.Choice(SKIPPABLE),
    help="Leave out a slow or unavailable layer (repeatable).",
)
@click.pass_obj
def doctor(obj: Context, as_json: bool, skip: tuple[str, ...]) -> None:
    """Check each layer a message passes, top to bottom; stop at the first that fails.

    \b
    Layers: config, database, migrations, model, tokenizer, engine (the local
    vLLM generates one token, or each remote server answers /v1/models and a
    one-token /v1/completions), then each Telegram bot (getMe, getWebhookInfo)
    and Slack app (auth.test). Exit code 1 when a layer fails.

    \b
    Examples:
      botctl doctor
      botctl --config /etc/bot/bot.toml doctor --json
      botctl doctor --skip engine          # quick: no engine start
    """

    def emit(result: CheckResult) -> None:
        click.echo(render_json(result) if as_json else render_text(result))

    def announce(text: str) -> None:
        # Progress for a person at a terminal; logs and --json stay quiet.
        if not as_json and sys.stderr.isatty():
            click.echo(text, err=True)

    results = asyncio.run(run_doctor(obj.config_path, skip=skip, emit=emit, announce=announce))
    failed = [result for result in results if not result.ok]
    if failed:
        if not as_json:
            click.echo(f"\nfailed at layer {failed[0].layer}", err=True)
        raise SystemExit(1)
    if not as_json:
        click.echo("\nall layers ok", err=True)
