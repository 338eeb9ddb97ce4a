"""A long history a client re-sends is engine work like any other: fair use counts all of it.

A history longer than the context window is written into a new conversation and
compacted by its first turn, whose summary is one more generation; the key's
day counts the turn's uncached prompt and reply and that summary's tokens.
"""

from __future__ import annotations

from typing import Any

from bot.engine.vllm_local import LocalVLLMEngine
from tests.conftest import MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.helpers import auth, load_turns
from tests.openai.helpers import DEMO_MODEL, sdk

EXCHANGES = 14


def _long_history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for n in range(EXCHANGES):
        words = " ".join(f"w{n}x{i}" for i in range(30))
        messages.append({"role": "user", "content": f"Question {n}: {words}"})
        messages.append({"role": "assistant", "content": f"Answer {n}: {words}"})
    return [*messages, {"role": "user", "content": "Sum it up."}]


async def test_the_summary_of_a_rebuilt_history_is_charged_to_the_key(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    spy = RecordingEngine(engine)
    client = await make_client(db_url, engine_override=spy)
    key = await issue_key(db_url)
    api = sdk(client, key)
    await api.chat.completions.create(model=DEMO_MODEL, messages=_long_history())
    (turn,) = await load_turns(db_url)
    assert turn.status == "done" and turn.compaction_id is not None
    summaries = [call for call in spy.calls if call.request.request_id.endswith(":summary")]
    assert len(summaries) == 1 and summaries[0].generated
    usage = await (await client.get("/v1/usage", headers=auth(key))).json()
    own = (turn.prompt_tokens or 0) - (turn.cached_tokens or 0) + (turn.completion_tokens or 0)
    assert usage["today"]["counted_tokens"] == own + len(summaries[0].generated)
