"""Model folders that appear whole or not at all.

A pulled folder is written under a temporary name beside its target and
renamed into place at the end, so an interrupted pull (Ctrl-C, a full disk, a
lost connection) never leaves a half-written folder that vLLM would try to load.
The last file written, ``pulled_model.json``, records where the folder came
from; its presence is what makes a second pull instant.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MARKER_FILE = "pulled_model.json"


class PullError(Exception):
    """A model could not be pulled; the message says why and what to do."""


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The source record of a complete pulled folder, or None when there is none."""
    try:
        data = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextmanager
def building(target: Path, source: dict[str, Any]) -> Iterator[Path]:
    """Yield an empty temporary folder; on success mark it and rename it to ``target``.

    ``target`` must not exist yet (callers return early when it is already complete).
    On failure the temporary folder is removed and ``target`` is left untouched.
    """
    if target.exists():
        raise PullError(
            f"{target} exists but was not written by `botctl model pull`: "
            "remove it or pull into another --path"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.partial-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        yield temporary
        (temporary / MARKER_FILE).write_text(json.dumps(source, indent=2) + "\n")
        # Same file system, so the rename is atomic: readers see no folder or a whole one.
        temporary.rename(target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
