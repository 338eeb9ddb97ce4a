"""Every benchmark still starts, and the one that needs no engine still measures.

A benchmark is run by hand, now and then: a module of the service moved or renamed since
would first show as a benchmark that no longer imports. ``--help`` imports a script and
all it imports; bench/sse_readers.py runs whole in seconds (it needs PostgreSQL and the
demo model's tokenizer, no engine).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_ADMIN_DSN

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=BENCH.parent,
        env={**os.environ, "BOT_TEST_POSTGRES_DSN": POSTGRES_ADMIN_DSN},
    )


SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if '__name__ == "__main__"' in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_starts(script: str) -> None:
    done = run(str(BENCH / script), "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout


def test_readers_of_a_turn_are_counted(demo_model_dir: Path) -> None:
    done = run(str(BENCH / "sse_readers.py"), "--readers", "20", "--model-dir", str(demo_model_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "20 readers of a queued turn" in done.stdout
    assert "2 s after they left" in done.stdout
