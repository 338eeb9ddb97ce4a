"""One doctor line per layer, and how it is printed (text for people, JSON for machines)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

# Doctor-only error classes, beside ``bot.errors.ErrorClass``: faults an admin
# fixes in the configuration or with a command, which no turn ever fails with.
CONFIG = "config"
PENDING_MIGRATION = "pending_migration"


class DoctorFailure(Exception):
    """A check failed: what broke (error class), what was seen, what usually fixes it."""

    def __init__(self, error_class: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.hint = hint


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


def render_json(result: CheckResult) -> str:
    return json.dumps(asdict(result))
