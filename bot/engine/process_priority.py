"""Optionally, the in-process engine's own processes yield the CPU to the service.

vLLM runs a local engine in child processes: an engine core that schedules and a
worker that runs the forward passes. On a machine with few cores they and the
event loop that acknowledges messages want the same cores, and the acks wait for
the engine's time slices. At a lower priority (a higher nice value,
``engine.process_nice``) the engine still gets every cycle the service leaves,
and a request that arrives runs at once. The price is the replies' speed, since
every token the service streams then takes the core from a forward pass: hence
off by default, for hosts whose acks must stay short under bursts. The figures
both ways are in the README (eighth session) and docs/scaling.md.

On Linux a nice value belongs to a thread, not a process: every thread of every
process the engine started is lowered, and threads they start later inherit it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil
import structlog

log = structlog.get_logger(__name__)


def descendants() -> set[int]:
    """Process ids of every process this one started, and theirs."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


def lower_priority(pids: Iterable[int], nice: int) -> int:
    """Raise the nice value of every thread of ``pids`` to at least ``nice``; never lower it.

    Returns how many threads were changed. A process that has exited or refuses
    (another user's) is skipped with a warning: this is a preference, not a duty.
    """
    changed = 0
    for pid in pids:
        try:
            threads = psutil.Process(pid).threads()
            for thread in threads:
                if os.getpriority(os.PRIO_PROCESS, thread.id) < nice:
                    os.setpriority(os.PRIO_PROCESS, thread.id, nice)
                    changed += 1
        except (psutil.Error, ProcessLookupError, PermissionError) as exc:
            log.warning("engine_priority_not_set", pid=pid, error=f"{type(exc).__name__}: {exc}")
    return changed
