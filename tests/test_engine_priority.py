"""The local engine's processes can run behind the service (``bot.engine.process_priority``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import psutil
import pytest

from bot.engine.process_priority import lower_priority
from bot.engine.settings import EngineSettings
from bot.engine.vllm_local import LocalVLLMEngine

ENGINE_NICE = 7


def thread_nices(process: psutil.Process) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, thread.id) for thread in process.threads()}


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
    engine = LocalVLLMEngine(engine_settings.model_copy(update={"process_nice": ENGINE_NICE}))
    await engine.start()
    try:
        processes = [psutil.Process(pid) for pid in engine.process_ids]
        # vLLM's own names for its processes (setproctitle): the engine core that
        # schedules and the worker that runs the model.
        names = sorted(process.name() for process in processes)
        assert [n for n in names if n.startswith("VLLM::EngineCor")], names
        assert [n for n in names if n.startswith("VLLM::Worker")], names
        for process in processes:
            assert thread_nices(process) == {max(service_nice, ENGINE_NICE)}, process.name()
        # The service keeps its own priority.
        assert thread_nices(psutil.Process()) == service_threads
    finally:
        await engine.shutdown()


async def test_by_default_the_engines_processes_keep_the_services_priority(
    engine: LocalVLLMEngine,
) -> None:
    service_nice = os.getpriority(os.PRIO_PROCESS, 0)
    assert engine.process_ids
    for pid in engine.process_ids:
        assert thread_nices(psutil.Process(pid)) == {service_nice}


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
