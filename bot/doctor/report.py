"""One doctor line per layer, and how it is printed (text for people, JSON for machines)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CheckResult:
    layer: str
    ok: bool
    ms: float
    detail: str = ""
    error_class: str | None = None
    hint: str | None = None
    skipped: bool = False


def render_text(result: CheckResult) -> str:
    status = "skip" if result.skipped else "ok" if result.ok else "FAIL"
    line = f"{status:<4}  {result.layer:<22} {result.ms:>8.0f} ms"
    if result.error_class:
        line += f"  [{result.error_class}]"
    if result.detail:
        line += f"  {result.detail}"
    if result.hint:
        line += f"\n      hint: {result.hint}"
    return line


def render_report(results: Sequence[CheckResult]) -> str:
    """The whole walk as one JSON document: ``ok``, the first ``failed_layer`` (or null),
    and every checked ``layers`` entry in order."""
    failed = next((result.layer for result in results if not result.ok), None)
    return json.dumps(
        {
            "ok": failed is None,
            "failed_layer": failed,
            "layers": [asdict(result) for result in results],
        },
        indent=2,
    )
