"""``/v1/responses`` and ``/v1/models`` through the real ``openai`` SDK."""

from __future__ import annotations

import itertools

import openai
import pytest

from tests.conftest import MakeClient, issue_key
from tests.helpers import load_turns
from tests.openai.helpers import DEMO_MODEL, USER_MESSAGES, cacheable, sdk


async def test_models_lists_the_served_model(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    models = [model.id async for model in api.models.list()]
    assert models == [DEMO_MODEL]
    assert (await api.models.retrieve(DEMO_MODEL)).id == DEMO_MODEL
    with pytest.raises(openai.NotFoundError):
        await api.models.retrieve("gpt-4o")


async def test_previous_response_id_continues_token_exactly(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    api = sdk(client, await issue_key(db_url))
    previous_id = None
    responses = []
    for text in USER_MESSAGES:
        response = await api.responses.create(
            model=DEMO_MODEL, input=text, previous_response_id=previous_id
        )
        assert response.status in {"completed", "incomplete"}
        assert response.output_text
        responses.append(response)
        previous_id = response.id

    for turn, (previous, current) in enumerate(itertools.pairwise(responses), start=2):
        assert previous.usage is not None and current.usage is not None
        expected = cacheable(previous.usage.input_tokens, previous.usage.output_tokens)
        cached = current.usage.input_tokens_details.cached_tokens
        assert cached >= expected, (turn, cached, expected)
        assert current.previous_response_id == previous.id

    turns = await load_turns(db_url)
    assert len(turns) == len(USER_MESSAGES)
    assert len({turn.conversation_id for turn in turns}) == 1
    # Only the new input was sent each time: the stored user texts are exactly those.
    assert [t.user_text for t in sorted(turns, key=lambda t: t.seq)] == USER_MESSAGES

    fetched = await api.responses.retrieve(responses[-1].id)
    assert fetched.output_text == responses[-1].output_text
    assert fetched.status == responses[-1].status


async def test_chat_completions_continue_a_responses_conversation(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    first = await api.responses.create(model=DEMO_MODEL, input="Start here.")
    second = await api.responses.create(
        model=DEMO_MODEL, input="Then this.", previous_response_id=first.id
    )
    completion = await api.chat.completions.create(
        model=DEMO_MODEL,
        messages=[
            {"role": "user", "content": "Start here."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "Then this."},
            {"role": "assistant", "content": second.output_text},
            {"role": "user", "content": "And now?"},
        ],
    )
    assert completion.usage is not None and second.usage is not None
    turns = await load_turns(sqlite_url)
    assert len({turn.conversation_id for turn in turns}) == 1
    details = completion.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert details.cached_tokens >= cacheable(second.usage.input_tokens, second.usage.output_tokens)


async def test_streamed_response_events(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    stream = await api.responses.create(model=DEMO_MODEL, input="Stream please.", stream=True)
    events = [event async for event in stream]
    types = [event.type for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert types[-1] in {"response.completed", "response.incomplete"}
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == deltas
    assert final.usage is not None and final.usage.output_tokens > 0
    (turn,) = await load_turns(sqlite_url)
    assert turn.reply_text == deltas
    assert final.id == f"resp_{turn.id}"


async def test_stored_false_hides_the_response(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    api = sdk(client, await issue_key(sqlite_url))
    hidden = await api.responses.create(model=DEMO_MODEL, input="Not kept.", store=False)
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(hidden.id)
    with pytest.raises(openai.BadRequestError) as caught:
        await api.responses.create(model=DEMO_MODEL, input="Go on.", previous_response_id=hidden.id)
    assert caught.value.param == "previous_response_id"


async def test_responses_belong_to_their_owner(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    alice = sdk(client, await issue_key(sqlite_url, "alice"))
    bob = sdk(client, await issue_key(sqlite_url, "bob"))
    response = await alice.responses.create(model=DEMO_MODEL, input="Mine.")
    with pytest.raises(openai.NotFoundError):
        await bob.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError):
        await bob.responses.create(
            model=DEMO_MODEL, input="Yours?", previous_response_id=response.id
        )


async def test_continuing_an_earlier_response_is_a_conflict(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    api = sdk(client, await issue_key(db_url))
    first = await api.responses.create(model=DEMO_MODEL, input="One.")
    await api.responses.create(model=DEMO_MODEL, input="Two.", previous_response_id=first.id)
    with pytest.raises(openai.ConflictError) as caught:
        await api.responses.create(model=DEMO_MODEL, input="Two'.", previous_response_id=first.id)
    assert caught.value.status_code == 409
    assert "latest" in caught.value.message
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "conflict"
    assert len(await load_turns(db_url)) == 2
