"""One key shared by many end users (a front end): no two requests ever share a conversation.

Many pairs of requests re-send the same stored history at once, each with a
private message of its own: one of each pair extends the stored conversation,
the other gets a conversation of its own rebuilt from the history, and no
conversation ever holds the other request's message. A ``previous_response_id``
continued twice at once is continued once; the second gets 409. OpenAI's
``user`` keeps two end users with the same history apart. Every stored head is
found by an index lookup, however many conversations the key has.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import openai
from sqlalchemy import select

from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation, Message
from tests.conftest import MakeClient, issue_key
from tests.helpers import load_turns
from tests.openai.helpers import DEMO_MODEL, cacheable, sdk

PAIRS = 6
CONVERSATIONS = 12


async def _entries_by_conversation(db_url: str) -> dict[str, list[str]]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            rows = await session.execute(select(Message.conversation_id, Message.text))
            found: dict[str, list[str]] = defaultdict(list)
            for conversation_id, text in rows:
                found[conversation_id].append(text)
            return found
    finally:
        await engine.dispose()


async def _conversation_count(db_url: str) -> int:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            return len((await session.scalars(select(Conversation.id))).all())
    finally:
        await engine.dispose()


def _pin(pair: int, side: str) -> str:
    return f"My PIN is {pair}{side}{pair * 7919 % 10_000:04d}, keep it secret."


async def test_concurrent_pairs_resending_one_history_never_share_a_conversation(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    api = sdk(client, await issue_key(db_url))
    openings = [[{"role": "user", "content": f"Hello, I am user {pair}."}] for pair in range(PAIRS)]
    firsts = await asyncio.gather(
        *(api.chat.completions.create(model=DEMO_MODEL, messages=opening) for opening in openings)
    )
    histories: list[list[Any]] = [
        [*opening, {"role": "assistant", "content": first.choices[0].message.content}]
        for opening, first in zip(openings, firsts, strict=True)
    ]
    sides = [(pair, side) for pair in range(PAIRS) for side in "AB"]
    answers = await asyncio.gather(
        *(
            api.chat.completions.create(
                model=DEMO_MODEL,
                messages=[*histories[pair], {"role": "user", "content": _pin(pair, side)}],
            )
            for pair, side in sides
        )
    )
    turns = {turn.id: turn for turn in await load_turns(db_url)}
    first_conversations = [
        turns[first.id.removeprefix("chatcmpl-")].conversation_id for first in firsts
    ]
    entries = await _entries_by_conversation(db_url)
    conversation_of = {}
    for (pair, side), answer in zip(sides, answers, strict=True):
        turn = turns[answer.id.removeprefix("chatcmpl-")]
        conversation_of[pair, side] = turn.conversation_id
        # Its prompt held its own history and message, nobody else's.
        other = _pin(pair, "B" if side == "A" else "A")
        assert not any(other in text for text in entries[turn.conversation_id]), (pair, side)
        for stranger in range(PAIRS):
            if stranger != pair:
                assert not any(
                    _pin(stranger, s) in text
                    for s in "AB"
                    for text in entries[turn.conversation_id]
                )
    for pair in range(PAIRS):
        a, b = conversation_of[pair, "A"], conversation_of[pair, "B"]
        assert a != b
        # One of the two extended the stored conversation; the other was given its own.
        assert {a, b} & {first_conversations[pair]} != set()
    assert await _conversation_count(db_url) == 2 * PAIRS


async def test_a_response_continued_twice_at_once_is_continued_once(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    api = sdk(client, await issue_key(db_url))
    first = await api.responses.create(model=DEMO_MODEL, input="Remember the number 41.")
    outcomes = await asyncio.gather(
        *(
            api.responses.create(
                model=DEMO_MODEL, input=f"Secret {n}: add {n}.", previous_response_id=first.id
            )
            for n in range(4)
        ),
        return_exceptions=True,
    )
    continued = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(continued) == 1, outcomes
    assert all(isinstance(o, openai.ConflictError) for o in refused), refused
    assert all(o.status_code == 409 and "latest" in o.message for o in refused)  # type: ignore[union-attr]
    assert len(await load_turns(db_url)) == 2
    assert await _conversation_count(db_url) == 1


async def test_two_end_users_with_the_same_history_get_their_own_conversations(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    opening = [{"role": "user", "content": "Hi!"}]
    first = await api.chat.completions.create(model=DEMO_MODEL, messages=opening, user="ann")
    history = [*opening, {"role": "assistant", "content": first.choices[0].message.content}]
    # Bob's front end re-sends the very same text: it is not Ann's conversation.
    bob = await api.chat.completions.create(
        model=DEMO_MODEL, messages=[*history, {"role": "user", "content": "I am Bob"}], user="bob"
    )
    ann = await api.chat.completions.create(
        model=DEMO_MODEL, messages=[*history, {"role": "user", "content": "I am Ann"}], user="ann"
    )
    turns = {f"chatcmpl-{turn.id}": turn for turn in await load_turns(sqlite_url)}
    assert turns[bob.id].conversation_id != turns[first.id].conversation_id
    assert turns[ann.id].conversation_id == turns[first.id].conversation_id
    assert ann.usage is not None and ann.usage.prompt_tokens_details is not None
    assert first.usage is not None
    assert (ann.usage.prompt_tokens_details.cached_tokens or 0) >= cacheable(
        first.usage.prompt_tokens, first.usage.completion_tokens
    )


async def test_every_conversation_of_a_busy_key_is_continued_token_exactly(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    histories: list[list[Any]] = []
    firsts = []
    for n in range(CONVERSATIONS):
        opening = [{"role": "user", "content": f"Conversation number {n} starts here."}]
        first = await api.chat.completions.create(model=DEMO_MODEL, messages=opening)
        firsts.append(first)
        histories.append(
            [*opening, {"role": "assistant", "content": first.choices[0].message.content}]
        )
    # The oldest first: a scan of the newest few would miss it.
    for history, first in zip(histories, firsts, strict=True):
        second = await api.chat.completions.create(
            model=DEMO_MODEL, messages=[*history, {"role": "user", "content": "And then?"}]
        )
        assert first.usage is not None and second.usage is not None
        details = second.usage.prompt_tokens_details
        assert details is not None and details.cached_tokens is not None
        assert details.cached_tokens >= cacheable(
            first.usage.prompt_tokens, first.usage.completion_tokens
        )
    assert await _conversation_count(sqlite_url) == CONVERSATIONS
