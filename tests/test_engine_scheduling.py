"""The in-process engine schedules a user's request before background work waiting with it."""

from __future__ import annotations

import asyncio
import random
import uuid

from bot.engine.base import BACKGROUND_PRIORITY, USER_PRIORITY, GenerationRequest
from bot.engine.vllm_local import LocalVLLMEngine
from tests.conftest import TEST_MAX_MODEL_LEN

BACKGROUND_REQUESTS = 12
"""Long prefills, several engine steps' worth: most of them wait to be scheduled."""
RUNNING_AT_ONCE = 3
"""Prefills the engine may have begun when the user's request arrives (not preempted)."""


def _request(name: str, prompt: list[int], priority: int) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"{name}-{uuid.uuid4().hex}",
        prompt_token_ids=prompt,
        max_tokens=1,
        temperature=0.0,
        top_p=1.0,
        # Each its own salt: no request finds another's blocks in the prefix cache.
        cache_salt=uuid.uuid4().hex,
        priority=priority,
    )


async def test_a_users_request_goes_before_background_work_queued_ahead_of_it(
    engine: LocalVLLMEngine,
) -> None:
    rng = random.Random(7)
    started: list[str] = []
    first_started = asyncio.Event()

    async def run(request: GenerationRequest) -> None:
        async for chunk in engine.generate(request):
            if chunk.token_ids and request.request_id not in started:
                started.append(request.request_id)
                first_started.set()

    background = [
        _request(
            f"background{n}",
            [rng.randrange(100, 2000) for _ in range(TEST_MAX_MODEL_LEN - 8)],
            BACKGROUND_PRIORITY,
        )
        for n in range(BACKGROUND_REQUESTS)
    ]
    tasks = [asyncio.create_task(run(request)) for request in background]
    # All of them reach the engine first (the first answer comes after every one was
    # added): under first come, first served, the user would wait for every one.
    await asyncio.wait_for(first_started.wait(), 120)
    done_before = len(started)
    user = _request("user", [rng.randrange(100, 2000) for _ in range(40)], USER_PRIORITY)
    tasks.append(asyncio.create_task(run(user)))
    await asyncio.gather(*tasks)

    assert len(started) == BACKGROUND_REQUESTS + 1
    # Still waiting when the user came: enough for the order to tell.
    assert done_before <= BACKGROUND_REQUESTS // 2, started
    # The user waits at most for the prefills already running, never for those waiting.
    assert started.index(user.request_id) <= done_before + RUNNING_AT_ONCE, (done_before, started)
