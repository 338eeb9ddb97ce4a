"""``engine.dtype = "auto"`` runs bfloat16 weights in float32 on a CPU that would emulate
bfloat16 (``bot.engine.cpu_dtype``), and nowhere else."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import psutil
import pytest

from bot.engine import cpu_dtype
from bot.engine.cpu_dtype import cpu_emulates_bfloat16, resolve_dtype


def model_dir(tmp_path: Path, dtype: str, weights_bytes: int = 1_000_000) -> Path:
    """A local model folder as vLLM reads it: config.json and its weights' file."""
    folder = tmp_path / f"model-{dtype}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": dtype}))
    with (folder / "model.safetensors").open("wb") as weights:
        weights.truncate(weights_bytes)  # sparse: only its size is read
    return folder


@pytest.fixture
def cpu_without_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_dtype, "cpu_emulates_bfloat16", lambda: True)


@pytest.mark.usefixtures("cpu_without_bfloat16")
def test_auto_runs_bfloat16_weights_in_float32_where_the_cpu_lacks_bfloat16(
    tmp_path: Path,
) -> None:
    assert resolve_dtype("auto", str(model_dir(tmp_path, "bfloat16")), on_cpu=True) == "float32"


@pytest.mark.usefixtures("cpu_without_bfloat16")
def test_the_older_torch_dtype_key_is_read_too(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, "bfloat16")
    (folder / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert resolve_dtype("auto", str(folder), on_cpu=True) == "float32"


@pytest.mark.usefixtures("cpu_without_bfloat16")
def test_everything_else_keeps_vllms_choice(tmp_path: Path) -> None:
    bf16 = str(model_dir(tmp_path, "bfloat16"))
    assert resolve_dtype("bfloat16", bf16, on_cpu=True) == "bfloat16"  # set explicitly
    assert resolve_dtype("auto", bf16, on_cpu=False) == "auto"
    assert resolve_dtype("auto", str(model_dir(tmp_path, "float16")), on_cpu=True) == "auto"
    assert resolve_dtype("auto", str(model_dir(tmp_path, "float32")), on_cpu=True) == "auto"
    # A hub id: no folder here to read or weigh.
    assert resolve_dtype("auto", "HuggingFaceTB/SmolLM2-135M-Instruct", on_cpu=True) == "auto"


@pytest.mark.usefixtures("cpu_without_bfloat16")
def test_weights_whose_float32_copy_would_not_fit_stay_bfloat16(tmp_path: Path) -> None:
    available = psutil.virtual_memory().available
    big = model_dir(tmp_path, "bfloat16", weights_bytes=available // 4)
    assert resolve_dtype("auto", str(big), on_cpu=True) == "auto"


def test_a_cpu_that_computes_bfloat16_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_dtype, "cpu_emulates_bfloat16", lambda: False)
    assert resolve_dtype("auto", str(model_dir(tmp_path, "bfloat16")), on_cpu=True) == "auto"


@pytest.mark.usefixtures("cpu_without_bfloat16")
def test_weights_of_any_format_are_weighed_and_unweighable_ones_keep_bfloat16(
    tmp_path: Path,
) -> None:
    available = psutil.virtual_memory().available
    folder = model_dir(tmp_path, "bfloat16")
    (folder / "model.safetensors").unlink()
    with (folder / "pytorch_model.bin").open("wb") as weights:
        weights.truncate(available // 4)
    assert resolve_dtype("auto", str(folder), on_cpu=True) == "auto"  # too big in float32
    (folder / "pytorch_model.bin").unlink()
    assert resolve_dtype("auto", str(folder), on_cpu=True) == "auto"  # nothing to weigh
    (folder / "model.safetensors").symlink_to(tmp_path / "cut-short-download")
    assert resolve_dtype("auto", str(folder), on_cpu=True) == "auto"
    config = folder / "config.json"
    assert resolve_dtype("auto", str(config), on_cpu=True) == "auto"  # a file, not a folder


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the kernel's x86 CPU flags")
def test_the_cpu_check_agrees_with_the_kernels_cpu_flags() -> None:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    assert cpu_emulates_bfloat16() == ("avx512f" not in flags)
