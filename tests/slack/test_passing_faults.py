"""A Web API call that fails for a passing reason (Slack's 5xx, a dropped connection, a short
outage) is tried again: every reply still arrives exactly once and every turn ends ``done``."""

from __future__ import annotations

import pytest

from bot.channels.slack.render import render_reply
from bot.testing.slack_api import FakeSlackApi
from tests.conftest import MakeClient
from tests.helpers import load_turns
from tests.slack.conftest import CHANNEL, idle, mention, post_event, slack_section

THREADS = ("1700000001.000100", "1700000002.000100")


@pytest.mark.parametrize(
    ("streaming", "fault", "failed"),
    [("stream", "503", 1), ("update", "dropped connection", 1), ("update", "503", 4)],
)
async def test_first_call_of_each_thread_fails_and_every_reply_arrives_once(
    slack_api: FakeSlackApi,
    make_client: MakeClient,
    sqlite_url: str,
    streaming: str,
    fault: str,
    failed: int,
) -> None:
    client = await make_client(
        sqlite_url, slack=slack_section(slack_api.base_url, streaming=streaming)
    )
    first = "chat.startStream" if streaming == "stream" else "chat.postMessage"
    for index, thread in enumerate(THREADS):
        if fault == "503":
            slack_api.fail(first, "service_unavailable", status=503, times=failed)
        else:
            slack_api.drop_connection(first, times=failed)
        status, _, _ = await post_event(client, mention(f"Ev0900FAULT{index}", thread))
        assert status == 200
        await idle(client)

    turns = await load_turns(sqlite_url)
    assert [turn.status for turn in turns] == ["done", "done"], [t.error_class for t in turns]
    assert [call.ok for call in slack_api.calls_to(first)] == ([False] * failed + [True]) * 2
    for thread, turn in zip(THREADS, turns, strict=True):
        [message] = slack_api.thread(CHANNEL, thread)
        reply = turn.reply_text or ""
        assert message.text == (reply if streaming == "stream" else render_reply(reply).text)
