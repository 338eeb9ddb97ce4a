"""``botctl doctor``: find the broken layer in one command.

With ``--json`` stdout carries exactly one JSON document (``render_report``), for
``botctl doctor --json | jq``: every log line goes to stderr, and so does anything
else written to file descriptor 1 while the checks run (the engine's child
processes and native libraries write there, below Python's logging).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator

import click

from bot.cli.common import Context
from bot.doctor import CheckResult, render_report, render_text, run_doctor
from bot.ops.log import configure_logging

DOCTOR_LOG_LEVEL = "WARNING"
"""The doctor's report is its lines: only warnings and errors are logged beside them
(unless ``logging.level`` is DEBUG)."""

SKIPPABLE = ("engine", "platforms")


@click.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON document on stdout ({ok, failed_layer, layers}), for machines.",
)
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

    _log_to_stderr(obj)

    def emit(result: CheckResult) -> None:
        if not as_json:
            click.echo(render_text(result))

    def announce(text: str) -> None:
        # Progress for a person at a terminal; logs and --json stay quiet.
        if not as_json and sys.stderr.isatty():
            click.echo(text, err=True)

    with _stdout_to_stderr() if as_json else contextlib.nullcontext():
        results = asyncio.run(run_doctor(obj.config_path, skip=skip, emit=emit, announce=announce))
    failed = [result for result in results if not result.ok]
    if as_json:
        click.echo(render_report(results))
    elif failed:
        click.echo(f"\nfailed at layer {failed[0].layer}", err=True)
    else:
        click.echo("\nall layers ok", err=True)
    if failed:
        raise SystemExit(1)


def _log_to_stderr(obj: Context) -> None:
    try:
        configured = obj.settings.logging
        level = "DEBUG" if configured.level == "DEBUG" else DOCTOR_LOG_LEVEL
        fmt = configured.format
    except click.ClickException:
        # A config that does not load is the doctor's first finding, not a crash here.
        level, fmt = DOCTOR_LOG_LEVEL, "auto"
    # The process's own stderr: a caller that swaps sys.stderr for a while (click's test
    # runner) closes its stand-in afterwards, and the handler outlives the command.
    configure_logging(level, fmt, stream=sys.__stderr__ or sys.stderr)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr for the block (child processes inherit it)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (a closed stdout): nothing to keep clean
        yield
        return
    os.dup2(2, 1)
    try:
        yield
    finally:
        # Whatever Python buffered meanwhile belongs to stderr too.
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
