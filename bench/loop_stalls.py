"""What the event loop was doing when it stalled, during a benchmark.

Runs another benchmark of this folder (``bench/load.py`` unless told) in this process and,
at its end, prints:

* ``iterations``: the event loop's iterations whose steps took longer than ``--step-ms``
  in all (every callback and task step that was ready at once: the loop reads no socket
  until they are done, so an ack arriving meanwhile waits for the whole iteration), and
  what their steps ran (a task's outermost coroutine, or the callback): how many steps,
  their time in all and the longest, and the collector's pauses among them;
* ``steps``: every event-loop step (one callback or one task step) that ran longer than
  ``--step-ms`` on its own, by what it ran, with how many, the time in all and the longest;
* ``gc``: the garbage collector's pauses by generation (count, time in all, longest);
* ``stalls``: where the main thread was, sampled by a watchdog thread every
  ``--sample-ms`` while a step had been running for longer than ``--step-ms``, the most
  frequent stacks first (their innermost frames).

Only what happens from the first HTTP request's step on is counted (the start-up's
imports and the engine's start are not serving), except that the full (generation 2)
collections are all listed, with when they happened.

``bench/load.py`` reports the loop's lag (a timer's lateness): that says the loop was
late, not whether one long step or many short ones made it late, nor which. A step is
timed by wrapping ``asyncio.events.Handle._run`` (private: this is a measuring tool, and
it costs each step a little); a sample is ``sys._current_frames()`` of the main thread,
taken when the thread gets the GIL (so a step that holds it in C shows as one sample).

Run:  .venv/bin/python bench/loop_stalls.py --rates 100 --seconds 8
      .venv/bin/python bench/loop_stalls.py --bench turns.py --conversations 16 --turns 3
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.events
import atexit
import functools
import gc
import runpy
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STACK_FRAMES = 8
"""Innermost frames kept of a sampled stack."""


@dataclass
class Tally:
    times_s: list[float] = field(default_factory=list)


@dataclass
class Settings:
    step_s: float = 0.05
    sample_s: float = 0.01


settings = Settings()
steps: defaultdict[str, Tally] = defaultdict(Tally)
# The current iteration's steps by what they ran, and the long iterations' in all.
iteration_steps: defaultdict[str, Tally] = defaultdict(Tally)
long_iteration_steps: defaultdict[str, Tally] = defaultdict(Tally)
long_iterations = Tally()
iterations = 0
FIRST_REQUEST = "task RequestHandler._handle_request"
first_request_at: float | None = None
"""When the first HTTP request's step ran: collections before it were the start-up's."""
full_collections: list[tuple[float, float]] = []
"""Generation 2 collections: (when, how long)."""
gc_pauses: defaultdict[int, Tally] = defaultdict(Tally)
samples: Counter[str] = Counter()
# The step running now: when it began (0.0: none), set and read without a lock (a float
# assignment is atomic under the GIL; a sample that races a step's end is merely dropped).
step_started = 0.0
main_ident = threading.get_ident()


def what_runs(handle: asyncio.events.Handle) -> str:
    callback: Any = handle._callback
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro: Any = owner.get_coro()
        return f"task {getattr(coro, '__qualname__', type(coro).__name__)}"
    # Named, never repr()'d: a repr can change what it shows. aiohttp's ClientResponse
    # caches ``headers`` on first access (``reify``): the repr of a callback bound to one
    # that has not started yet caches None, and its start then fails (389 Slack
    # deliveries in one run, 'NoneType' object has no attribute 'getall').
    if isinstance(callback, functools.partial):
        callback = callback.func
    name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
    return f"callback {name}"


original_run = asyncio.events.Handle._run


def timed_run(self: asyncio.events.Handle) -> None:
    global step_started, first_request_at
    started = time.perf_counter()
    step_started = started
    try:
        original_run(self)
    finally:
        step_started = 0.0
        took = time.perf_counter() - started
        what = what_runs(self)
        iteration_steps[what].times_s.append(took)
        if first_request_at is None and what == FIRST_REQUEST:
            first_request_at = started
        if took > settings.step_s and first_request_at is not None:
            steps[what].times_s.append(took)


original_run_once = asyncio.base_events.BaseEventLoop._run_once


def timed_run_once(self: asyncio.base_events.BaseEventLoop) -> None:
    global iterations
    iteration_steps.clear()
    original_run_once(self)
    iterations += 1
    # The collector's pauses are inside steps: listed, not added again.
    if first_request_at is None:
        return  # the start-up's (imports, the engine's start): not what serving costs
    took = sum(sum(t.times_s) for what, t in list(iteration_steps.items()) if what[0] != "(")
    if took > settings.step_s:
        long_iterations.times_s.append(took)
        for what, tally in iteration_steps.items():
            long_iteration_steps[what].times_s.extend(tally.times_s)


gc_started: dict[int, float] = {}


def on_gc(phase: str, info: dict[str, Any]) -> None:
    generation = int(info["generation"])
    if phase == "start":
        gc_started[generation] = time.perf_counter()
    elif generation in gc_started:
        took = time.perf_counter() - gc_started.pop(generation)
        if first_request_at is not None:
            gc_pauses[generation].times_s.append(took)
        if generation == 2:
            full_collections.append((time.perf_counter() - took, took))
        iteration_steps[f"(collector, generation {generation})"].times_s.append(took)


def watch() -> None:
    """Samples the main thread's stack while a step has run for longer than the limit."""
    while True:
        time.sleep(settings.sample_s)
        began = step_started
        if first_request_at is None or not began or time.perf_counter() - began < settings.step_s:
            continue
        frame = sys._current_frames().get(main_ident)
        if frame is None:
            continue
        stack = traceback.extract_stack(frame)[-STACK_FRAMES:]
        samples[
            " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(stack))
        ] += 1


def report() -> None:
    limit_ms = settings.step_s * 1000
    times = long_iterations.times_s
    print(
        f"\n# {iterations} loop iterations, {len(times)} of them with over {limit_ms:g} ms of"
        f" steps: {sum(times) * 1000:.0f} ms in all, longest {max(times, default=0) * 1000:.0f}"
    )
    print(f"{'steps':>6} {'all_ms':>9} {'max_ms':>8}  what ran in those iterations")
    ranked = sorted(long_iteration_steps.items(), key=lambda item: -sum(item[1].times_s))
    for what, tally in ranked[:15]:
        times = tally.times_s
        print(f"{len(times):6d} {sum(times) * 1000:9.1f} {max(times) * 1000:8.1f}  {what}")
    print(f"\n# loop steps longer than {limit_ms:g} ms, by what they ran")
    print(f"{'count':>6} {'all_ms':>9} {'max_ms':>8}  what")
    for what, tally in sorted(steps.items(), key=lambda item: -sum(item[1].times_s)):
        times = tally.times_s
        print(f"{len(times):6d} {sum(times) * 1000:9.1f} {max(times) * 1000:8.1f}  {what}")
    print("\n# garbage collector pauses by generation, from the first request on")
    print(f"{'gen':>3} {'count':>6} {'all_ms':>9} {'max_ms':>8}")
    for generation, tally in sorted(gc_pauses.items()):
        times = tally.times_s
        print(f"{generation:3d} {len(times):6d} {sum(times) * 1000:9.1f} {max(times) * 1000:8.1f}")
    start = first_request_at or 0.0
    print("generation 2 pauses, s after the first request (negative: before): ms")
    print(
        "  " + ", ".join(f"{at - start:+.1f}: {took * 1000:.0f}" for at, took in full_collections)
    )
    every = settings.sample_s * 1000
    print(f"\n# where long steps were, sampled every {every:g} ms (innermost first)")
    for stack, count in samples.most_common(12):
        print(f"{count:5d}  {stack}")


def take_option(name: str, default: float) -> float:
    if name in sys.argv:
        at = sys.argv.index(name)
        value = float(sys.argv[at + 1])
        del sys.argv[at : at + 2]
        return value
    return default


def main() -> None:
    bench = "load.py"
    if "--bench" in sys.argv:
        at = sys.argv.index("--bench")
        bench = sys.argv[at + 1]
        del sys.argv[at : at + 2]
    settings.step_s = take_option("--step-ms", 50.0) / 1000
    settings.sample_s = take_option("--sample-ms", 10.0) / 1000
    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop._run_once = timed_run_once  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    threading.Thread(target=watch, name="stall-watch", daemon=True).start()
    atexit.register(report)
    sys.argv = [str(HERE / bench), *sys.argv[1:]]
    runpy.run_path(str(HERE / bench), run_name="__main__")


if __name__ == "__main__":
    main()
