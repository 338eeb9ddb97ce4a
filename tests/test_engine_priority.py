"""The local engine's processes make room for the service (``bot.engine.process_priority``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from bot.engine.process_priority import (
    ENGINE_CORE_TITLE,
    WORKER_TITLE,
    lower_priority,
    move_core_onto_worker_cpus,
    thread_cpus,
    titled,
)
from bot.engine.settings import EngineSettings
from bot.engine.vllm_local import LocalVLLMEngine

ENGINE_NICE = 7


def thread_nices(process: psutil.Process) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, thread.id) for thread in process.threads()}


def thread_affinities(process: psutil.Process) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(thread.id)) for thread in process.threads()}


def processes(engine: LocalVLLMEngine, title: str) -> list[psutil.Process]:
    return [psutil.Process(pid) for pid in titled(engine.process_ids, title)]


def titled_sleeper(title: str, cpus: set[int] | None = None) -> subprocess.Popen[bytes]:
    """A process the kernel names ``title`` (as vLLM's setproctitle does), on ``cpus``."""
    script = (
        f"open('/proc/self/comm', 'w').write({title!r}); import sys, time;"
        " sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    child.stdout.close()
    if cpus is not None:
        os.sched_setaffinity(child.pid, cpus)
    return child


@pytest.fixture
def sleeper() -> Iterator[psutil.Process]:
    child = subprocess.Popen(["sleep", "60"])
    try:
        yield psutil.Process(child.pid)
    finally:
        child.kill()
        child.wait()


async def test_every_thread_of_the_engines_processes_yields_to_the_service(
    engine_settings: EngineSettings,
) -> None:
    service_nice = os.getpriority(os.PRIO_PROCESS, 0)
    service_threads = thread_nices(psutil.Process())
    engine = LocalVLLMEngine(
        engine_settings.model_copy(
            update={"process_nice": ENGINE_NICE, "core_on_worker_cpus": False}
        )
    )
    await engine.start()
    try:
        started = [psutil.Process(pid) for pid in engine.process_ids]
        # vLLM's own names for its processes (setproctitle): the engine core that
        # schedules and the worker that runs the model.
        assert processes(engine, ENGINE_CORE_TITLE), [p.name() for p in started]
        assert processes(engine, WORKER_TITLE), [p.name() for p in started]
        for process in started:
            assert thread_nices(process) == {max(service_nice, ENGINE_NICE)}, process.name()
        # The service keeps its own priority.
        assert thread_nices(psutil.Process()) == service_threads
        # Left where vLLM started it: wherever this process may run.
        for core in processes(engine, ENGINE_CORE_TITLE):
            assert thread_affinities(core) == {frozenset(os.sched_getaffinity(0))}
    finally:
        await engine.shutdown()


async def test_by_default_the_engine_core_runs_on_the_workers_cpus(
    engine: LocalVLLMEngine,
) -> None:
    service_nice = os.getpriority(os.PRIO_PROCESS, 0)
    service_cpus = frozenset(os.sched_getaffinity(0))
    workers = processes(engine, WORKER_TITLE)
    worker_cpus = frozenset(thread_cpus(worker.pid for worker in workers))
    # vLLM's CPU build binds the worker to all CPUs but one (VLLM_CPU_OMP_THREADS_BIND=auto).
    assert worker_cpus < service_cpus, "the worker is not bound: nothing to leave to the service"
    cores = processes(engine, ENGINE_CORE_TITLE)
    assert cores
    for core in cores:
        assert thread_affinities(core) == {worker_cpus}
    # Both keep the service's priority, and the service runs anywhere.
    for process in cores + workers:
        assert thread_nices(process) == {service_nice}
    assert thread_affinities(psutil.Process()) == {service_cpus}


def test_a_core_without_bound_workers_stays_where_it_is(sleeper: psutil.Process) -> None:
    """A GPU build, or ``VLLM_CPU_OMP_THREADS_BIND=nobind``: no spare CPU for the service."""
    before = os.sched_getaffinity(sleeper.pid)
    assert move_core_onto_worker_cpus([sleeper.pid]) == frozenset()
    assert os.sched_getaffinity(sleeper.pid) == before
    assert thread_nices(sleeper) == {os.getpriority(os.PRIO_PROCESS, 0)}


def test_lowering_raises_the_nice_value_of_every_thread_and_never_lowers_it(
    sleeper: psutil.Process,
) -> None:
    assert lower_priority([sleeper.pid], 7) == 1
    assert thread_nices(sleeper) == {7}
    # Already behind: left as it is.
    assert lower_priority([sleeper.pid], 3) == 0
    assert thread_nices(sleeper) == {7}


def test_a_process_that_is_gone_is_skipped(sleeper: psutil.Process) -> None:
    sleeper.kill()
    sleeper.wait()
    assert lower_priority([sleeper.pid], 7) == 0


def test_a_core_that_is_gone_is_not_reported_moved() -> None:
    """The engine core exits while it is being moved: skipped, and no CPUs reported."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: a worker's and a spare one")
    worker = titled_sleeper(WORKER_TITLE, {cpus[0]})
    core = titled_sleeper(ENGINE_CORE_TITLE)
    live_core = titled_sleeper(ENGINE_CORE_TITLE)
    try:
        pids = [worker.pid, core.pid, live_core.pid]
        assert titled(pids, ENGINE_CORE_TITLE) == [core.pid, live_core.pid]
        core.kill()
        core.wait()
        # The live core moves; the gone one is skipped without an error.
        assert move_core_onto_worker_cpus(pids) == {cpus[0]}
        assert os.sched_getaffinity(live_core.pid) == {cpus[0]}
        live_core.kill()
        live_core.wait()
        assert move_core_onto_worker_cpus(pids) == frozenset()
    finally:
        for child in (worker, core, live_core):
            child.kill()
            child.wait()
