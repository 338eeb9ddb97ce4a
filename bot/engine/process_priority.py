"""Where and how urgently the in-process engine's own processes run, next to the service.

vLLM runs a local engine in child processes: an engine core that schedules and a
worker that runs the forward passes. On a CPU build vLLM binds the worker's
threads to all CPUs but one and leaves that one for the engine core, which does
not stay on it: the core, the worker and the event loop that acknowledges
messages then want the same cores, and the acks wait for the engine's time
slices.

Two remedies, with their measured effect in docs/scaling.md:

* ``engine.core_on_worker_cpus`` (on by default): the engine core runs on the
  worker's CPUs. Core and worker take turns (the core schedules a step, the
  worker computes it, the core reads the result), and the spare CPU is the
  service's alone. The price is the time both spend waiting for each other on
  one CPU, where each spins between steps: a lone chat's replies decode about a
  fifth slower, while 16 chats at once went as fast or faster. At the lowest
  priority there, the core came too late for each step (slower still).
* ``engine.process_nice`` (off by default): every thread of the engine's
  processes at a higher nice value. The engine still gets every cycle the
  service leaves, but every token the service streams then takes the core from
  a forward pass, so replies come slower.

On Linux a nice value and a CPU affinity belong to a thread, not a process: every
thread is changed, and threads started later inherit the value of their parent.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil
import structlog

log = structlog.get_logger(__name__)

ENGINE_CORE_TITLE = "VLLM::EngineCor"
"""vLLM's process title for its engine core (setproctitle), as the kernel keeps it
(15 characters: ``VLLM::EngineCore`` cut short)."""
WORKER_TITLE = "VLLM::Worker"


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
            for thread in psutil.Process(pid).threads():
                if os.getpriority(os.PRIO_PROCESS, thread.id) < nice:
                    os.setpriority(os.PRIO_PROCESS, thread.id, nice)
                    changed += 1
        except (psutil.Error, ProcessLookupError, PermissionError) as exc:
            log.warning("engine_priority_not_set", pid=pid, error=f"{type(exc).__name__}: {exc}")
    return changed


def titled(pids: Iterable[int], title: str) -> list[int]:
    """Those of ``pids`` whose process title starts with ``title``."""
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).name().startswith(title):
                found.append(pid)
        except psutil.Error:
            continue
    return found


def thread_cpus(pids: Iterable[int]) -> set[int]:
    """Every CPU some thread of ``pids`` may run on."""
    cpus: set[int] = set()
    for pid in pids:
        try:
            for thread in psutil.Process(pid).threads():
                cpus |= os.sched_getaffinity(thread.id)
        except (psutil.Error, ProcessLookupError):
            continue
    return cpus


def move_core_onto_worker_cpus(pids: Iterable[int]) -> frozenset[int]:
    """Run the engine core among ``pids`` on the CPUs its workers are bound to.

    Returns those CPUs once a core has moved, or nothing when none did: no core
    found, or the workers not bound to fewer CPUs than this process may use (a GPU
    build, ``VLLM_CPU_OMP_THREADS_BIND=nobind``), where there is no spare CPU to
    leave to the service.
    """
    pids = list(pids)
    worker_cpus = frozenset(thread_cpus(titled(pids, WORKER_TITLE)))
    if not worker_cpus or worker_cpus >= os.sched_getaffinity(0):
        return frozenset()
    moved = False
    for pid in titled(pids, ENGINE_CORE_TITLE):
        try:
            for thread in psutil.Process(pid).threads():
                os.sched_setaffinity(thread.id, worker_cpus)
            moved = True
        except (psutil.Error, ProcessLookupError, PermissionError) as exc:
            log.warning("engine_core_not_moved", pid=pid, error=f"{type(exc).__name__}: {exc}")
    return worker_cpus if moved else frozenset()
