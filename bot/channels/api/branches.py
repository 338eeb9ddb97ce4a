"""Regenerate, edit and switch branches (``bot.turns.branching``) over the HTTP API.

``POST /v1/turns/{id}/regenerate`` and ``POST /v1/turns/{id}/edit`` answer like
``POST /v1/messages``: 202 with the new turn once it is stored, or its events
as Server-Sent Events when the client asks for ``text/event-stream``. A turn
that cannot be forked now (not the conversation's latest, still being
answered, conversation closed) gets 409 with the reason; nothing is stored.
``POST /v1/turns/{id}/activate`` makes the branch through that turn's reply
the active one. ``POST /v1/turns/{id}/continue`` carries on a reply cut at the
length limit (docs/replies.md): a new turn whose reply starts with the cut one,
``continued_chars`` characters of it; its events start after them.
"""

from __future__ import annotations

from aiohttp import web

from bot.apikeys import Principal
from bot.channels.api.streaming import reserve_stream, stream_turn, wants_event_stream
from bot.channels.ingress import PostedText, rate_limited, read_posted
from bot.http.errors import json_error
from bot.http.key_gate import Scope, requires
from bot.http.keys import SERVER, TURNS
from bot.turns.accepting import Accepted
from bot.turns.branching import Edit, ForkRefused


def _conflict(reason: str) -> web.Response:
    return json_error(409, "conflict", reason)


async def _forked(
    request: web.Request, edit: Edit | None, owner: str, *, continues: bool = False
) -> Accepted | web.Response:
    turn_id = request.match_info["turn_id"]
    turns = request.app[TURNS]
    try:
        if continues:
            accepted = await turns.continue_reply(turn_id, owner=owner)
        elif edit is None:
            accepted = await turns.regenerate(turn_id, owner=owner)
        else:
            accepted = await turns.edit(turn_id, edit, owner=owner)
    except LookupError:
        return json_error(404, "not_found", f"no turn {turn_id}")
    except ForkRefused as exc:
        return _conflict(exc.reason)
    if accepted.rate_limited is not None:
        return rate_limited(accepted.rate_limited)
    return accepted


async def _answer(
    request: web.Request, edit: Edit | None, principal: Principal, *, continues: bool = False
) -> web.StreamResponse:
    slot = reserve_stream(request, principal) if wants_event_stream(request) else None
    if isinstance(slot, web.Response):
        return slot
    try:
        accepted = await _forked(request, edit, principal.owner, continues=continues)
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    if isinstance(accepted, web.Response):
        if slot is not None:
            slot.release()
        return accepted
    if slot is not None:
        return await stream_turn(request, accepted.turn_id, accepted.continued_chars, slot)
    body: dict[str, object] = {
        "turn_id": accepted.turn_id,
        "stream_url": f"/v1/turns/{accepted.turn_id}/events",
        "duplicate": False,
    }
    if continues:
        body["continued_chars"] = accepted.continued_chars
    return web.json_response(body, status=202)


@requires(Scope.CHAT)
async def regenerate(request: web.Request, principal: Principal) -> web.StreamResponse:
    return await _answer(request, None, principal)


@requires(Scope.CHAT)
async def continue_reply(request: web.Request, principal: Principal) -> web.StreamResponse:
    return await _answer(request, None, principal, continues=True)


@requires(Scope.CHAT)
async def edit(request: web.Request, principal: Principal) -> web.StreamResponse:
    body = await read_posted(request, PostedText, request.app[SERVER])
    if isinstance(body, web.Response):
        return body
    return await _answer(request, Edit(body.text), principal)


@requires(Scope.CHAT)
async def activate(request: web.Request, principal: Principal) -> web.Response:
    turn_id = request.match_info["turn_id"]
    try:
        head = await request.app[TURNS].activate(turn_id, owner=principal.owner)
    except LookupError:
        return json_error(404, "not_found", f"no turn {turn_id}")
    except ForkRefused as exc:
        return _conflict(exc.reason)
    if head is None:
        return _conflict("the turn has no stored reply: there is no branch through it")
    return web.json_response({"turn_id": turn_id, "active": True})


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/turns/{turn_id}/regenerate", regenerate)
    app.router.add_post("/v1/turns/{turn_id}/edit", edit)
    app.router.add_post("/v1/turns/{turn_id}/continue", continue_reply)
    app.router.add_post("/v1/turns/{turn_id}/activate", activate)
