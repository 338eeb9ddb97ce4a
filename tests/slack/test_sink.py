"""The Slack reply sink against the strict fake Web API, through the real slack_sdk client."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import replace

import aiohttp
import pytest

from bot.channels.base import TurnAddress
from bot.channels.slack.channel import SlackChannel
from bot.channels.slack.render import render_reply
from bot.channels.slack.sink import SlackReplySink
from bot.channels.slack.splitting import split
from bot.errors import DeliveryError, ErrorClass
from bot.testing.slack_api import FakeSlackApi
from bot.turns.replies import delivery_of
from tests.slack.conftest import BOT_USER, TEAM, TOKEN, MakeChannel, app_settings

CHANNEL = "C0001CHAN"
DM = "D0001DM"
THREAD = "1700000001.000100"


def address(
    channel: str = CHANNEL, *, thread_ts: str | None = THREAD, dm: bool = False
) -> TurnAddress:
    return TurnAddress(
        turn_id="turn-1",
        conversation_id="conv-1",
        channel="slack:main",
        reply_to={
            "team_id": TEAM,
            "channel_id": channel,
            "thread_ts": thread_ts,
            "message_ts": thread_ts or "1700000100.000300",
            "user_id": "U0001ALICE",
            "is_dm": dm,
        },
    )


def open_sink(channel: SlackChannel, addr: TurnAddress | None = None) -> SlackReplySink:
    sink = channel.open_reply(addr or address())
    assert isinstance(sink, SlackReplySink)
    return sink


async def play(sink: SlackReplySink, text: str, *, step: int = 7, pause: float = 0.005) -> None:
    """Feed ``text`` as an engine would: cumulative deltas, then finish."""
    await sink.start()
    for end in range(step, len(text), step):
        await sink.delta(text[:end])
        await asyncio.sleep(pause)
    await sink.finish(text)


REPLY = "A **river** is a natural stream of water. It flows to the sea, a lake or another river."


async def test_stream_mode_streams_markdown_into_the_thread(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    sink = open_sink(make_channel(streaming="stream"))
    await play(sink, REPLY)
    [message] = slack_api.thread(CHANNEL, THREAD)
    assert message.via == "stream" and not message.streaming
    assert message.text == REPLY
    start = slack_api.calls_to("chat.startStream")[0]
    assert (
        start.args["recipient_team_id"] == TEAM and start.args["recipient_user_id"] == "U0001ALICE"
    )
    assert message.appends >= 1
    assert all(c.ok for c in slack_api.calls)


async def test_update_mode_posts_then_edits_a_markdown_block_with_plain_text(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    sink = open_sink(make_channel(streaming="update"))
    await play(sink, REPLY)
    [message] = slack_api.thread(CHANNEL, THREAD)
    assert message.via == "post"
    assert message.blocks == [{"type": "markdown", "text": REPLY}]
    assert message.text == render_reply(REPLY).text
    assert all(call.args.get("blocks") for call in slack_api.calls_to("chat.update"))
    assert message.edits >= 1
    assert slack_api.unchanged_updates == 0
    assert not slack_api.calls_to("chat.startStream")


async def test_dm_update_replies_top_level_and_stream_replies_in_a_thread(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    dm = address(DM, thread_ts=None, dm=True)
    await play(open_sink(make_channel(streaming="update"), dm), "hello there")
    assert slack_api.thread_text(DM, None) == ["hello there"]
    await play(open_sink(make_channel(streaming="stream"), dm), "streamed hello")
    assert slack_api.thread_text(DM, "1700000100.000300") == ["streamed hello"]
    # DMs need no recipient ids, but sending them is harmless and the fake accepts both.
    assert slack_api.calls_to("chat.startStream", ok=True)


async def test_auto_falls_back_when_the_workspace_cannot_stream(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    slack_api.workspaces[TOKEN].streaming = False
    channel = make_channel(streaming="auto")
    await play(open_sink(channel), REPLY)
    assert slack_api.thread_text(CHANNEL, THREAD) == [render_reply(REPLY).text]
    assert [c.response["error"] for c in slack_api.calls_to("chat.startStream")] == [
        "unknown_method"
    ]
    # Learnt for the workspace: the next reply does not try again.
    second = address(thread_ts="1700000002.000100")
    await play(open_sink(channel, second), "second")
    assert len(slack_api.calls_to("chat.startStream")) == 1
    assert slack_api.thread_text(CHANNEL, "1700000002.000100") == ["second"]


async def test_long_update_reply_continues_in_further_messages(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    text = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 20 for i in range(20))
    sink = open_sink(make_channel(streaming="update", max_message_chars=4000))
    await play(sink, text, step=400)
    shown = slack_api.thread_text(CHANNEL, THREAD)
    assert len(shown) == len(text) // 4000 + 1 or len(shown) == len(text) // 4000 + 2
    assert all(0 < len(part) <= 4000 for part in shown)
    # Each message shows its own piece of the reply.
    assert shown == [render_reply(piece).text for piece in split(text, 4000)]
    assert slack_api.unchanged_updates == 0


async def test_long_stream_reply_respects_the_per_call_limit(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    text = "word " * 6000  # 30,000 characters
    sink = open_sink(make_channel(streaming="stream", max_message_chars=40_000))
    await sink.start()
    await sink.delta(text[:25_000])  # one delta larger than a stream call may carry
    await sink.finish(text)
    [message] = slack_api.thread(CHANNEL, THREAD)
    assert message.text == text
    for call in slack_api.calls:
        assert len(call.args.get("markdown_text") or "") <= 12_000
    assert all(c.ok for c in slack_api.calls)


async def test_long_stream_reply_is_split_into_messages(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    text = "```\n" + "\n".join(f"row {i}" for i in range(300)) + "\n```\nDone."
    sink = open_sink(make_channel(streaming="stream", max_message_chars=500))
    await play(sink, text, step=50)
    shown = slack_api.thread(CHANNEL, THREAD)
    assert len(shown) > 3
    assert all(not m.streaming and len(m.text) <= 500 for m in shown)
    assert all(m.text.count("```") % 2 == 0 for m in shown)
    assert shown[-1].text.endswith("Done.")


async def test_429_is_waited_out_and_the_final_text_still_lands(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    slack_api.intervals["chat.update"] = 0.3
    sink = open_sink(make_channel(streaming="update", update_interval_s=0.01))
    await play(sink, REPLY, step=3, pause=0.01)
    assert slack_api.thread_text(CHANNEL, THREAD) == [render_reply(REPLY).text]
    limited = [c for c in slack_api.calls if c.status == 429]
    assert limited, "the test should have provoked a 429"
    assert slack_api.violations == 0, "a call went out before Retry-After had passed"
    assert sink.describe()["retry_lost_s"] >= 1.0


async def test_rate_limit_past_the_budget_gives_up_as_rate_limited(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    slack_api.fail("chat.postMessage", "ratelimited", times=5, retry_after=1)
    sink = open_sink(make_channel(streaming="update", max_retry_wait_s=1.5))
    with pytest.raises(DeliveryError) as raised:
        await play(sink, "hi there")
    assert raised.value.error_class is ErrorClass.RATE_LIMITED


@pytest.mark.parametrize(
    ("error", "error_class"),
    [
        ("invalid_auth", ErrorClass.AUTH),
        ("token_revoked", ErrorClass.AUTH),
        ("account_inactive", ErrorClass.AUTH),
        ("channel_not_found", ErrorClass.DELIVERY),
        ("not_in_channel", ErrorClass.DELIVERY),
        ("msg_too_long", ErrorClass.DELIVERY),
    ],
)
async def test_platform_errors_map_to_error_classes(
    slack_api: FakeSlackApi, make_channel: MakeChannel, error: str, error_class: ErrorClass
) -> None:
    slack_api.fail("chat.postMessage", error)
    sink = open_sink(make_channel(streaming="update"))
    with pytest.raises(DeliveryError) as raised:
        await play(sink, "hello")
    assert raised.value.error_class is error_class


async def test_revoked_token_gets_no_apology_attempt(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    slack_api.revoke(TOKEN)
    sink = open_sink(make_channel(streaming="stream"))
    with pytest.raises(DeliveryError) as raised:
        await play(sink, "hello")
    assert raised.value.error_class is ErrorClass.AUTH
    calls = len(slack_api.calls)
    await sink.fail(ErrorClass.AUTH, "Sorry")
    assert len(slack_api.calls) == calls


async def test_missing_channel_gets_no_apology_attempt(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    slack_api.channel_errors[CHANNEL] = "channel_not_found"
    sink = open_sink(make_channel(streaming="update"))
    with pytest.raises(DeliveryError):
        await play(sink, "hello")
    calls = len(slack_api.calls)
    await sink.fail(ErrorClass.DELIVERY, "Sorry")
    assert len(slack_api.calls) == calls


async def test_failure_mid_stream_ends_the_stream_with_an_apology(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    sink = open_sink(make_channel(streaming="stream"))
    await sink.start()
    await sink.delta("The answer is 42, unl")  # a partial last word is held back
    await asyncio.sleep(0.2)
    await sink.fail(ErrorClass.ENGINE_UNAVAILABLE, "Sorry, the assistant is unavailable right now.")
    [message] = slack_api.thread(CHANNEL, THREAD)
    assert message.text == "The answer is 42, \n\n_Sorry, the assistant is unavailable right now._"
    assert not message.streaming


async def test_failure_before_any_text_posts_the_apology(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    sink = open_sink(make_channel(streaming="update"))
    await sink.start()
    await sink.fail(ErrorClass.TIMEOUT, "Sorry, the assistant took too long to answer.")
    assert slack_api.thread_text(CHANNEL, THREAD) == [
        "_Sorry, the assistant took too long to answer._"
    ]


async def test_a_stream_slack_ended_goes_on_by_editing_the_same_message(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    sink = open_sink(make_channel(streaming="stream"))
    await sink.start()
    await sink.delta("First part,")
    await asyncio.sleep(0.2)
    [message] = slack_api.thread(CHANNEL, THREAD)
    slack_api.expire_stream(CHANNEL, message.ts)
    await sink.delta("First part, then **more**")
    await sink.finish("First part, then **more** and the end.")
    assert slack_api.thread_text(CHANNEL, THREAD) == ["First part, then more and the end."]
    [message] = slack_api.thread(CHANNEL, THREAD)
    assert message.blocks == [
        {"type": "markdown", "text": "First part, then **more** and the end."}
    ]


async def test_user_pressing_stop_cancels_delivery(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    sink = open_sink(make_channel(streaming="stream"))
    await sink.start()
    await sink.delta("Once upon")
    await asyncio.sleep(0.2)
    [message] = slack_api.thread(CHANNEL, THREAD)
    slack_api.stop_by_user(CHANNEL, message.ts)
    with pytest.raises(DeliveryError) as raised:
        await play(sink, "Once upon a time there was a bot.")
    assert raised.value.error_class is ErrorClass.CANCELLED
    calls = len(slack_api.calls)
    await sink.fail(ErrorClass.CANCELLED, "Stopped.")
    assert len(slack_api.calls) == calls, "no apology under a message the user stopped"


async def test_never_sends_empty_or_unchanged_text(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    for mode, thread in (("update", "1700000003.000100"), ("stream", "1700000004.000100")):
        sink = open_sink(make_channel(streaming=mode), address(thread_ts=thread))
        await sink.start()
        for text in ["", " ", "\n", "Hi", "Hi", "Hi ", "Hi \ufffd", "Hi there"]:
            await sink.delta(text)
            await asyncio.sleep(0.08)
        await sink.finish("Hi there")
        assert slack_api.thread_text(CHANNEL, thread) == ["Hi there"]
    assert all(c.ok for c in slack_api.calls), [c.response for c in slack_api.calls if not c.ok]
    assert slack_api.unchanged_updates == 0


async def test_network_failure_is_a_network_error(http: aiohttp.ClientSession) -> None:
    closed = FakeSlackApi()
    base_url = await closed.start()
    await closed.close()  # nothing listens there any more
    # Refused connections are retried within the budget: a small one, so that it runs out.
    channel = SlackChannel(
        app_settings(base_url, streaming="update", api_timeout_s=2, max_retry_wait_s=1), http
    )
    sink = open_sink(channel)
    with pytest.raises(DeliveryError) as raised:
        await play(sink, "hello")
    assert raised.value.error_class is ErrorClass.NETWORK


async def test_empty_reply_sends_nothing(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    sink = open_sink(make_channel(streaming="stream"))
    await sink.start()
    await sink.finish("")
    assert slack_api.calls == []
    assert BOT_USER  # the fake's bot identity stays untouched


async def _until(predicate: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_a_stop_lets_the_call_in_flight_land_and_closes_that_very_stream(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    # Cut off mid-call, chat.startStream still lands on Slack but its ts is lost: the
    # stream would stay open beside a second message carrying the apology.
    slack_api.delays["chat.startStream"] = 0.5
    sink = open_sink(make_channel(streaming="stream"))
    await sink.start()
    await sink.delta("The answer is 42, ")
    await _until(lambda: "chat.startStream" in slack_api.arrived, "chat.startStream in flight")
    await sink.fail(ErrorClass.CANCELLED, "Stopped.")
    await _until(lambda: slack_api.calls_to("chat.startStream") != [], "chat.startStream answered")
    [message] = slack_api.thread(CHANNEL, THREAD)
    assert message.text == "The answer is 42, \n\n_Stopped._"
    assert not message.streaming
    assert slack_api.arrived.count("chat.startStream") == 1


async def test_a_turn_stopped_inside_finish_still_closes_its_stream(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    # The turn's task is cancelled while the final push is on its way: the pump
    # finishes that push (the stream is closed), then the apology follows it.
    slack_api.delays["chat.startStream"] = 0.5
    sink = open_sink(make_channel(streaming="stream"))
    await sink.start()
    finishing = asyncio.create_task(sink.finish("All done here."))
    await _until(lambda: "chat.startStream" in slack_api.arrived, "chat.startStream in flight")
    finishing.cancel()
    await asyncio.wait({finishing})
    await sink.fail(ErrorClass.CANCELLED, "Stopped.")
    await _until(lambda: slack_api.calls_to("chat.startStream") != [], "chat.startStream answered")
    shown = slack_api.thread(CHANNEL, THREAD)
    assert [m.text for m in shown] == ["All done here.", "_Stopped._"]
    assert not any(m.streaming for m in shown)
    assert slack_api.arrived.count("chat.startStream") == 1


def reopen_sink(channel: SlackChannel, dead: SlackReplySink) -> SlackReplySink:
    """The sink a worker taking the turn over opens, from the dead one's saved state."""
    state = delivery_of(dead)
    addr = replace(address(), delivery=json.loads(json.dumps(state)))  # as the row stores it
    return open_sink(channel, addr)


async def die_after(sink: SlackReplySink, text: str, slack_api: FakeSlackApi) -> None:
    """The worker streams ``text`` so far, its calls land, then it dies."""
    await sink.start()
    await sink.delta(text)
    await asyncio.sleep(0.3)  # its last push is out; nothing more comes from it
    assert slack_api.thread(CHANNEL, THREAD)


@pytest.mark.parametrize("mode", ["stream", "update"])
async def test_a_reply_taken_over_goes_on_in_the_same_message(
    slack_api: FakeSlackApi, make_channel: MakeChannel, mode: str
) -> None:
    """A worker died half-way through a reply: the one that takes the turn over goes on
    with the message the user already sees, and the reply is posted once."""
    channel = make_channel(streaming=mode)
    first = open_sink(channel)
    await die_after(first, REPLY[:40], slack_api)

    second = reopen_sink(channel, first)
    await second.start()
    await second.delta(REPLY[:60])
    await second.finish(REPLY)

    [message] = slack_api.thread(CHANNEL, THREAD)
    assert not message.streaming
    assert message.text == (REPLY if mode == "stream" else render_reply(REPLY).text)
    starts = "chat.startStream" if mode == "stream" else "chat.postMessage"
    assert len(slack_api.calls_to(starts)) == 1
    assert all(c.ok for c in slack_api.calls)


async def test_a_stream_that_ended_with_its_worker_is_finished_by_editing_it(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    """Slack stopped taking appends to the dead worker's stream: the worker taking over
    finishes that same message with chat.update, and posts nothing new."""
    channel = make_channel(streaming="stream")
    first = open_sink(channel)
    await die_after(first, REPLY[:40], slack_api)
    [message] = slack_api.thread(CHANNEL, THREAD)
    slack_api.expire_stream(CHANNEL, message.ts)

    second = reopen_sink(channel, first)
    await second.start()
    await second.finish(REPLY)

    [message] = slack_api.thread(CHANNEL, THREAD)
    assert message.text == render_reply(REPLY).text
    assert len(slack_api.calls_to("chat.startStream")) == 1
    assert not slack_api.calls_to("chat.postMessage")


@pytest.mark.parametrize("mode", ["stream", "update"])
async def test_a_long_reply_taken_over_after_its_first_messages_posts_each_once(
    slack_api: FakeSlackApi, make_channel: MakeChannel, mode: str
) -> None:
    """Taken over after the reply outgrew its first messages (a code fence cut open
    across them): the rest goes on in the message being written, each piece once."""
    text = "```\n" + "\n".join(f"row {i}" for i in range(120)) + "\n```\nDone."
    channel = make_channel(streaming=mode, max_message_chars=300)
    first = open_sink(channel)
    await first.start()
    for end in range(100, len(text) // 2, 100):
        await first.delta(text[:end])
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)
    before = len(slack_api.thread(CHANNEL, THREAD))
    assert before >= 2

    second = reopen_sink(channel, first)
    await play(second, text, step=100, pause=0.05)

    shown = slack_api.thread(CHANNEL, THREAD)
    assert all(not m.streaming for m in shown)
    if mode == "update":
        assert [m.text for m in shown] == [render_reply(p).text for p in split(text, 300)]
    else:
        assert all(m.text.count("```") % 2 == 0 for m in shown)
        assert shown[-1].text.endswith("Done.")

    # Nothing twice, nothing lost: the messages hold the reply once, but for the fences
    # closed and reopened where they were cut.
    def bare(shown_text: str) -> str:
        return re.sub(r"```|\s", "", shown_text)

    assert "".join(bare(m.text) for m in shown) == bare(text)


async def test_a_stream_finished_before_its_worker_died_is_not_posted_again(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    """The worker closed the stream with the whole reply and died before the turn was
    recorded done: the one that takes over delivers the reply again, into that message."""
    channel = make_channel(streaming="stream")
    first = open_sink(channel)
    await play(first, REPLY)

    second = reopen_sink(channel, first)
    await second.start()
    await second.finish(REPLY)

    [message] = slack_api.thread(CHANNEL, THREAD)
    assert message.text in (REPLY, render_reply(REPLY).text)
    assert len(slack_api.calls_to("chat.startStream")) == 1
    assert not slack_api.calls_to("chat.postMessage")
