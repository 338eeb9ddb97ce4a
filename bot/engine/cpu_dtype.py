"""What ``engine.dtype = "auto"`` runs on a CPU: float32 where bfloat16 would be emulated.

"auto" takes the checkpoint's dtype, bfloat16 for most chat models today (SmolLM2
included). vLLM's CPU build runs each linear layer through oneDNN, which on an x86
CPU without AVX-512 BF16 or AMX refuses bfloat16 weights ("Failed to create oneDNN
linear, fallback to torch linear") and torch's own linear then emulates it: on an
AVX2-only machine, 4 chats at once decoded 21.0 tokens/s in bfloat16 against 50.8 in
float32, one chat 13.9 against 15.2 (docs/performance.md, twenty-eighth session).
There "auto" becomes float32, which is also the more exact of the two, unless the
float32 copy of the weights would take more than a quarter of the memory available
(a large model's bfloat16 may be all that fits). A dtype set explicitly, a GPU, a
CPU that computes bfloat16 natively, or a model named by a hub id (its weights are
not here to weigh) keep vLLM's choice.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import psutil

FLOAT32_SHARE_OF_MEMORY = 0.25
"""The most of the available memory the float32 copy of the weights may take."""


def cpu_computes_bfloat16() -> bool:
    """True where this machine's CPU has bfloat16 instructions oneDNN uses (AVX-512 BF16,
    AMX), or is not x86 (vLLM's other CPU builds take bfloat16 their own way)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def checkpoint_dtype(model_dir: Path) -> str | None:
    """The dtype a local model's config.json says its weights are in, if it says."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    found = config.get("dtype") or config.get("torch_dtype")
    return found if isinstance(found, str) else None


def weights_bytes(model_dir: Path) -> int:
    return sum(path.stat().st_size for path in model_dir.glob("*.safetensors"))


def resolve_dtype(dtype: str, model: str, *, on_gpu: bool) -> str:
    """The dtype to start the local engine with for the configured ``dtype``."""
    if dtype != "auto" or on_gpu:
        return dtype
    model_dir = Path(model)
    if checkpoint_dtype(model_dir) != "bfloat16" or cpu_computes_bfloat16():
        return dtype
    # float32 takes twice bfloat16's bytes.
    if 2 * weights_bytes(model_dir) > FLOAT32_SHARE_OF_MEMORY * psutil.virtual_memory().available:
        return dtype
    return "float32"
