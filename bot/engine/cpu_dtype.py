"""What ``engine.dtype = "auto"`` runs on a CPU: float32 where bfloat16 would be emulated.

"auto" takes the checkpoint's dtype, bfloat16 for most chat models today (SmolLM2
included). vLLM's CPU build runs each linear layer through oneDNN, which on an x86
CPU without AVX-512 refuses bfloat16 weights ("Failed to create oneDNN linear,
fallback to torch linear") and torch's own linear then emulates bfloat16: on an
AVX2-only AMD EPYC, 4 chats at once decode 19.0 tokens/s in bfloat16 against 51.2 in
float32, one chat about the same (14.3 against 13.5; SmolLM2, docs/performance.md).
There "auto" becomes float32, also the
more exact of the two, unless the float32 copy of the weights would take more than a
quarter of the memory available (a large model's bfloat16 may be all that fits).

The KV cache follows the model's dtype: in float32 ``engine.cpu_kvcache_space_gib``
holds half as many tokens (SmolLM2 at 1 GiB: some 23,000, still far more than a
handful of chats keep).

A dtype set explicitly, another platform than the CPU, a CPU with AVX-512, or a model
named by a hub id (its weights are not here to weigh) keep vLLM's choice. On an
AVX-512 CPU with BF16 instructions bfloat16 is the faster (4 chats 148-193 tokens/s
against float32's 137 on an AMD EPYC, 83 against 57 on an Intel Xeon with AMX); one with
AVX-512 and no BF16 is not measured.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import psutil

FLOAT32_SHARE_OF_MEMORY = 0.25
"""The most of the available memory the float32 copy of the weights may take."""
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


def cpu_emulates_bfloat16() -> bool:
    """True on an x86 CPU without AVX-512, where oneDNN refuses bfloat16 weights."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    import torch

    return not torch.cpu._is_avx512_supported()


def checkpoint_dtype(model_dir: Path) -> str | None:
    """The dtype a local model's config.json says its weights are in, if it says."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    found = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    return found if isinstance(found, str) else None


def weights_bytes(model_dir: Path) -> int | None:
    """The size of a local model's weight files; None when there are none to weigh."""
    try:
        files = [path for pattern in WEIGHT_FILES for path in model_dir.glob(pattern)]
        sizes = [path.stat().st_size for path in files]
    except OSError:  # a file that is not there after all (a download cut short)
        return None
    return sum(sizes) if sizes else None


def resolve_dtype(dtype: str, model: str, *, on_cpu: bool) -> str:
    """The dtype to start the local engine with for the configured ``dtype``."""
    if dtype != "auto" or not on_cpu:
        return dtype
    model_dir = Path(model)
    if checkpoint_dtype(model_dir) != "bfloat16" or not cpu_emulates_bfloat16():
        return dtype
    weights = weights_bytes(model_dir)
    # float32 takes twice bfloat16's bytes.
    available = psutil.virtual_memory().available
    if weights is None or 2 * weights > FLOAT32_SHARE_OF_MEMORY * available:
        return dtype
    return "float32"
