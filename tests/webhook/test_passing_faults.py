"""A callback that fails for a passing reason (a 502, a dropped connection, an answer that
comes too late) is tried again: every reply arrives exactly once (a late answer's repeat has
the same ``X-Webhook-Delivery`` id, which the receiver drops) and every turn ends ``done``."""

from __future__ import annotations

from typing import Any

import pytest

from bot.http.keys import TURNS
from tests.conftest import MakeClient
from tests.helpers import load_turns
from tests.webhook.conftest import Receiver, message, post_signed, webhook_settings

CONVERSATIONS = ("c1", "c2")


def _taken_once(receiver: Receiver) -> list[dict[str, Any]]:
    """What a receiver that drops repeated delivery ids keeps, in arrival order."""
    seen: set[str] = set()
    kept = []
    for attempt in receiver.attempts:
        delivery = attempt.headers["X-Webhook-Delivery"]
        if 200 <= attempt.status < 300 and delivery not in seen:
            seen.add(delivery)
            kept.append(attempt.document)
    return kept


@pytest.mark.parametrize("fault", ["502", "dropped connection", "late answer"])
async def test_first_callback_of_each_conversation_fails_and_every_reply_arrives_once(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver, fault: str
) -> None:
    client = await make_client(
        sqlite_url, webhooks=webhook_settings(receiver, callback_timeout_s=0.5)
    )
    turn_ids = []
    for index, conversation in enumerate(CONVERSATIONS):
        if fault == "502":
            receiver.fail_statuses = [502]
        elif fault == "dropped connection":
            receiver.drop_next = 1
        else:
            receiver.late_next, receiver.late_s = 1, 1.0
        response = await post_signed(client, message(f"m{index}", conversation))
        turn_ids.append((await response.json())["turn_id"])
        await client.app[TURNS].wait_idle(timeout=30)

    turns = {turn.id: turn for turn in await load_turns(sqlite_url)}
    assert [turns[turn_id].status for turn_id in turn_ids] == ["done", "done"]
    kept = _taken_once(receiver)
    for turn_id in turn_ids:
        mine = [callback for callback in kept if callback["turn_id"] == turn_id]
        assert [callback["seq"] for callback in mine] == list(range(len(mine)))
        *chunks, final = mine
        assert final["type"] == "final" and final["text"] == turns[turn_id].reply_text
        assert "".join(chunk["text"] for chunk in chunks) == final["text"]
        first = [a for a in receiver.attempts if a.document["turn_id"] == turn_id][:2]
        assert [a.document["seq"] for a in first] == [0, 0], "the first callback was retried"
