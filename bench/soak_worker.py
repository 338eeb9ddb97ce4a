"""One real ``botctl serve`` worker whose database writes fail at random (for bench/soak.py).

It is ``botctl serve`` itself, started through this file so that a listener
on SQLAlchemy's ``before_cursor_execute`` (on the ``Engine`` class, so every
engine the service builds gets it) can raise the error a dropped connection
raises, at a random share of the app's writes (INSERT, UPDATE, DELETE): the
accept, the start, the partial replies, the final status, the history, the
leases, the takeover. The same kind of fault as ``WriteFaults`` in
tests/turns/test_final_state.py, only at random and in a separate process.

Environment (set by bench/soak.py; everything else is ``botctl``'s own):

  SOAK_DB_FAULT_RATE     share of writes that fail, e.g. 0.02 (0: none)
  SOAK_DB_FAULT_AFTER_S  no fault before this many seconds after start (start-up
                         itself is not what the soak measures)
  SOAK_DB_FAULT_SEED     random seed
  SOAK_DB_FAULT_STOP     a file: once it exists, no more faults (the run is over)

Each injected fault is logged as ``soak_db_fault`` (JSON, like the service's lines).
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.cli import main as botctl

STOP_CHECK_S = 0.5
WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


class RandomWriteFaults:
    def __init__(self, rate: float, after_s: float, seed: int, stop_file: Path | None) -> None:
        self._rate = rate
        self._from = time.monotonic() + after_s
        self._random = random.Random(seed)
        self._stop_file = stop_file
        self._checked_at = 0.0
        self._log = structlog.get_logger("bench.soak")

    def _stopped(self) -> bool:
        now = time.monotonic()
        if self._stop_file is not None and now - self._checked_at > STOP_CHECK_S:
            self._checked_at = now
            if self._stop_file.exists():
                self._rate = 0.0
        return self._rate <= 0

    def __call__(self, _conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if time.monotonic() < self._from or not WRITE.match(statement) or self._stopped():
            return
        if self._random.random() >= self._rate:
            return
        self._log.warning("soak_db_fault", statement=" ".join(statement.split()[:3]))
        raise OperationalError(statement, params, ConnectionResetError("injected fault"))


def install_from_environment() -> None:
    faults = RandomWriteFaults(
        rate=float(os.environ.get("SOAK_DB_FAULT_RATE", "0")),
        after_s=float(os.environ.get("SOAK_DB_FAULT_AFTER_S", "0")),
        seed=int(os.environ.get("SOAK_DB_FAULT_SEED", "0")),
        stop_file=Path(stop) if (stop := os.environ.get("SOAK_DB_FAULT_STOP")) else None,
    )
    event.listen(Engine, "before_cursor_execute", faults)


if __name__ == "__main__":
    install_from_environment()
    botctl.main(args=["serve"], prog_name="botctl")
