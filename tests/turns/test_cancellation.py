"""Stop requests reach a turn's generation whenever they arrive, and only once."""

from __future__ import annotations

import asyncio

from bot.turns.cancellation import Cancellations


async def _generate_forever() -> None:
    await asyncio.Event().wait()


async def test_a_stop_before_generation_cancels_it_as_it_starts() -> None:
    cancellations = Cancellations()
    assert cancellations.request("t1") is True
    generation = asyncio.create_task(_generate_forever())
    with cancellations.generating("t1", generation):
        await asyncio.gather(generation, return_exceptions=True)
    assert generation.cancelled()


async def test_a_stop_during_generation_cancels_it_once() -> None:
    cancellations = Cancellations()
    generation = asyncio.create_task(_generate_forever())
    with cancellations.generating("t1", generation):
        await asyncio.sleep(0)
        assert not generation.done()
        assert cancellations.request("t1") is True
        assert cancellations.request("t1") is False  # asked again: nothing more happens
        await asyncio.gather(generation, return_exceptions=True)
    assert generation.cancelled()


async def test_a_stop_after_generation_touches_nothing_and_is_forgotten() -> None:
    cancellations = Cancellations()
    generation = asyncio.create_task(asyncio.sleep(0))
    with cancellations.generating("t1", generation):
        await generation
    # The final write comes now: a stop arriving here has no task to cancel.
    assert cancellations.request("t1") is True
    assert not generation.cancelled()
    cancellations.forget("t1")
    other = asyncio.create_task(asyncio.sleep(0))
    with cancellations.generating("t1", other):  # the id again, e.g. a later run
        await other
    assert not other.cancelled()
