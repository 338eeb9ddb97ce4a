"""The aiohttp application: wiring of database, engine, turn service and channels.

Lifetimes live in ``cleanup_ctx``: the database engine, the outbound HTTP
client, the inference engine (unless the caller owns one, as tests do) and the
turn service (which resumes queued turns on start and drains on stop).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import sqlalchemy.exc
import structlog
from aiohttp import web

from bot.channels.registry import CHANNEL_SETUPS
from bot.config import Settings
from bot.engine.base import InferenceEngine
from bot.http import ops
from bot.http.clients import platform_client
from bot.http.errors import json_error
from bot.http.keys import (
    CHAT_FORMAT,
    DB_PROBE,
    ENGINE,
    HTTP_CLIENT,
    READ_SESSIONS,
    REQUEST_RECEIVED_AT,
    REQUEST_STARTED,
    SESSIONS,
    SETTINGS,
    TURNS,
)
from bot.storage.db import (
    create_engine,
    create_probe_engine,
    create_read_sessionmaker,
    create_sessionmaker,
)
from bot.turns.chat_format import ChatFormat, ChatFormatSource, load_tokenizer
from bot.turns.claims import build_claims
from bot.turns.limits import FairUse
from bot.turns.partials import PartialReplies
from bot.turns.policy import build_policy
from bot.turns.runner import TurnRunner
from bot.turns.service import TurnService
from bot.turns.streams import TurnStreams

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Stamp arrival time and bind a request id to every log line of this request."""
    request[REQUEST_STARTED] = time.perf_counter()
    request[REQUEST_RECEIVED_AT] = time.time()
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=uuid.uuid4().hex[:16])
    return await handler(request)


STORAGE_RETRY_AFTER_S = 1
STORAGE_UNAVAILABLE = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,  # no pooled connection in time
    sqlalchemy.exc.DisconnectionError,
    ConnectionError,
)


@web.middleware
async def storage_unavailable(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The database did not answer: 503 and nothing stored, so the sender may try again.

    Telegram, Slack and webhook senders redeliver on a non-2xx answer; the
    delivery is deduplicated once it is stored, so a retry is never answered twice.
    """
    try:
        return await handler(request)
    except STORAGE_UNAVAILABLE as exc:
        log.warning("storage_unavailable", error=type(exc).__name__)
        response = json_error(
            503, "unavailable", "the service cannot store messages right now; try again"
        )
        response.headers["Retry-After"] = str(STORAGE_RETRY_AFTER_S)
        return response


def build_engine(settings: Settings) -> InferenceEngine:
    if settings.engine.kind == "local":
        from bot.engine.vllm_local import LocalVLLMEngine

        return LocalVLLMEngine(settings.engine)
    from bot.engine.openai_remote import OpenAIRemoteEngine

    return OpenAIRemoteEngine(settings.engine)


async def create_app(
    settings: Settings,
    *,
    engine: InferenceEngine | None = None,
    chat_format: ChatFormat | None = None,
) -> web.Application:
    """Build the app. Pass ``engine`` to share one already started (its owner stops it)."""
    app = web.Application(
        client_max_size=settings.server.max_body_bytes,
        middlewares=[request_context, storage_unavailable],
    )
    app[SETTINGS] = settings
    db_engine = create_engine(settings.database.url, echo=settings.database.echo)
    sessions = create_sessionmaker(db_engine)
    app[SESSIONS] = sessions
    app[READ_SESSIONS] = create_read_sessionmaker(db_engine)
    db_probe = create_probe_engine(settings.database.url)
    app[DB_PROBE] = db_probe
    owns_engine = engine is None
    inference = engine if engine is not None else build_engine(settings)
    app[ENGINE] = inference
    turns = TurnService(sessions, TurnStreams())
    app[TURNS] = turns
    turns.claims = build_claims(settings.workers, settings.database.url, sessions)
    turns.fair_use = FairUse(settings.limits)
    http = platform_client()
    app[HTTP_CLIENT] = http
    metrics = ops.setup(app)
    turns.endings.observers.append(metrics.observe_turn)
    formats = ChatFormatSource(
        lambda: (
            chat_format
            or ChatFormat(
                load_tokenizer(settings.engine.tokenizer or settings.engine.model),
                settings.chat.system_prompt,
            )
        )
    )
    app[CHAT_FORMAT] = formats

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        if owns_engine:
            await inference.start()
        fmt = formats.get()
        turns.set_runner(
            TurnRunner(
                sessions=sessions,
                engine=inference,
                chat_format=fmt,
                streams=turns.streams,
                generation=settings.generation,
                open_reply=turns.open_reply,
                policy=build_policy(
                    compaction=settings.compaction,
                    generation=settings.generation,
                    tenancy=settings.tenancy,
                    pending_messages=settings.chat.pending_messages,
                    chat_format=fmt,
                    engine=inference,
                    sessions=sessions,
                    fair_use=turns.fair_use,
                    partials=(
                        None
                        if turns.claims.exclusive
                        else PartialReplies(sessions, turns.claims.worker_id)
                    ),
                ),
                endings=turns.endings,
                cancellations=turns.cancellations,
            )
        )
        await turns.recover()
        log.info("service_started", host=settings.server.host, port=settings.server.port)
        yield
        # ops.drain (on_shutdown) has drained the turns already; this is a no-op then.
        await turns.shutdown(settings.server.shutdown_grace_s)
        log.info("service_stopping")
        await http.close()
        if owns_engine:
            await inference.shutdown()
        await db_engine.dispose()
        await db_probe.dispose()

    app.cleanup_ctx.append(lifetime)
    for setup in CHANNEL_SETUPS:
        setup(app, settings, turns, http)
    return app
