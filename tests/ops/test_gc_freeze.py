"""The objects loaded before the service starts are left out of the garbage collector's walks.

With the engine and its libraries loaded, a full collection walked millions of objects
and stalled the event loop for 250-380 ms (bench/load.py): every ack waiting meanwhile.
"""

from __future__ import annotations

import gc
import time

from tests.conftest import MakeClient


async def test_a_full_collection_while_serving_skips_what_was_loaded_before(
    sqlite_url: str, make_client: MakeClient
) -> None:
    assert gc.get_freeze_count() == 0
    client = await make_client(sqlite_url)
    loaded = gc.get_freeze_count()
    # vLLM, torch, transformers and the app: far more than a turn's worth of objects.
    assert loaded > 100_000
    started = time.perf_counter()
    gc.collect()
    serving_ms = (time.perf_counter() - started) * 1000
    await client.close()
    assert gc.get_freeze_count() == 0  # given back to the collector at shutdown
    started = time.perf_counter()
    gc.collect()
    unfrozen_ms = (time.perf_counter() - started) * 1000
    assert serving_ms < unfrozen_ms / 2, (serving_ms, unfrozen_ms)
