"""The aiohttp application: wiring of database, engine, turn service and channels.

Lifetimes live in ``cleanup_ctx``: the database engine, the outbound HTTP
client, the inference engine (unless the caller owns one, as tests do) and the
turn service (which resumes queued turns on start and drains on stop).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from bot.apikeys import keep_keys_fresh
from bot.channels.api import routes as api_routes
from bot.channels.discord import routes as discord_routes
from bot.channels.kind import Wiring
from bot.channels.openai import routes as openai_routes
from bot.channels.slack import routes as slack_routes
from bot.channels.telegram import routes as telegram_routes
from bot.channels.webhook import routes as webhook_routes
from bot.config import Settings
from bot.engine.base import InferenceEngine
from bot.http import cors, favicon, openapi, ops
from bot.http.clients import platform_client
from bot.http.keys import (
    CHAT_FORMAT,
    DB_ANSWERS,
    DB_ENGINES,
    DB_PROBE,
    ENGINE,
    ENGINE_SETTINGS,
    HTTP_CLIENT,
    READ_SESSIONS,
    SERVER,
    SESSIONS,
    SHORT_READS,
    TURNS,
    USAGE,
)
from bot.http.middleware import request_context
from bot.storage.db import (
    create_probe_engine,
    create_read_sessionmaker,
    create_service_engines,
    create_sessionmaker,
    watch_answers,
)
from bot.storage.kept import kept_for_accepts
from bot.turns.carried import CarriedHistories
from bot.turns.chat_format import ChatFormat, ChatFormatSource, load_tokenizer
from bot.turns.claims import build_claims
from bot.turns.limits import FairUse
from bot.turns.partials import PartialReplies
from bot.turns.personas import Personas
from bot.turns.policy import build_policy
from bot.turns.runner import TurnRunner
from bot.turns.service import TurnService
from bot.turns.streams import TurnStreams
from bot.turns.usage import UsageReports
from bot.warm_up import warm_up
from bot.web import routes as web_page

log = structlog.get_logger(__name__)


def build_engine(settings: Settings) -> InferenceEngine:
    if settings.engine.kind == "local":
        from bot.engine.vllm_local import LocalVLLMEngine

        return LocalVLLMEngine(settings.engine)
    from bot.engine.openai_remote import OpenAIRemoteEngine

    return OpenAIRemoteEngine(settings.engine)


def add_channels(app: web.Application, settings: Settings, wiring: Wiring) -> None:
    """Every kind of channel the service answers on, each given its configured tables."""
    telegram_routes.setup(app, settings.telegram, wiring)
    slack_routes.setup(app, settings.slack, wiring)
    discord_routes.setup(app, settings.discord, wiring)
    webhook_routes.setup(app, settings.webhooks, wiring)
    api_routes.setup(app, wiring)
    openai_routes.setup(app, wiring)


async def create_app(
    settings: Settings,
    *,
    engine: InferenceEngine | None = None,
    chat_format: ChatFormat | None = None,
) -> web.Application:
    """Build the app. Pass ``engine`` to share one already started (its owner stops it)."""
    app = web.Application(
        client_max_size=settings.server.max_body_bytes,
        middlewares=[request_context],
    )
    app[SERVER] = settings.server
    app[ENGINE_SETTINGS] = settings.engine
    engines = create_service_engines(settings.database.url, echo=settings.database.echo)
    app[DB_ENGINES] = engines
    # Request handlers (the accepts among them) on the requests' engine, the turns'
    # work on the turns' engine: on PostgreSQL two pools (``ServiceEngines``).
    sessions = create_sessionmaker(engines.requests)
    app[SESSIONS] = sessions
    read_sessions = create_read_sessionmaker(engines.requests)
    app[READ_SESSIONS] = read_sessions
    # A turn's own reads (its history, a prepared base) and a request's key check are
    # short and on the critical path: on SQLite they run on the loop's thread, without a
    # trip to aiosqlite's (each trip waits for that thread and then for a loop iteration).
    app[SHORT_READS] = create_read_sessionmaker(engines.requests, in_place=True)
    turn_sessions = create_sessionmaker(engines.turns)
    turn_reads = create_read_sessionmaker(engines.turns, in_place=True)
    db_probe = create_probe_engine(settings.database.url, one_round_trip=True)
    app[DB_PROBE] = db_probe
    app[DB_ANSWERS] = watch_answers(*engines.distinct)
    inference = engine if engine is not None else build_engine(settings)
    app[ENGINE] = inference
    turns = TurnService(
        sessions,
        TurnStreams(),
        turn_sessions=turn_sessions,
        claims=build_claims(settings.workers, settings.database.url, turn_sessions),
        runs_turns=settings.workers.run_turns,
        fair_use=FairUse(settings.limits),
        personas=Personas(settings.personas, generation=settings.generation),
        kept_accepts=kept_for_accepts(engines.requests),
    )
    app[TURNS] = turns
    # An ingress-only process never generates: it starts no engine (nor frees one).
    starts_engine = engine is None and settings.workers.run_turns
    app[USAGE] = UsageReports(read_sessions, turns.fair_use)
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
        if starts_engine:
            await inference.start()
        fmt = formats.get()
        policy = build_policy(
            compaction=settings.compaction,
            generation=settings.generation,
            tenancy=settings.tenancy,
            pending_messages=settings.chat.pending_messages,
            chat_format=fmt,
            engine=inference,
            sessions=turn_sessions,
            read_sessions=turn_reads,
            fair_use=turns.fair_use,
            partials=(
                None
                if turns.claims.exclusive
                else PartialReplies(turn_sessions, turns.claims.worker_id)
            ),
        )
        runner = TurnRunner(
            sessions=turn_sessions,
            read_sessions=turn_reads,
            engine=inference,
            chat_format=fmt,
            streams=turns.streams,
            generation=settings.generation,
            open_reply=turns.open_reply,
            policy=policy,
            endings=turns.endings,
            cancellations=turns.cancellations,
            personas=turns.personas,
        )
        turns.set_runner(runner, carried=CarriedHistories(read_sessions, fmt))
        await turns.recover()
        # The pools' connections opened and the statements of a message's way to its
        # first token compiled before the first message rather than in it (bot.warm_up).
        connections = await engines.open_pools()
        await warm_up(turns, runner, key_reads=app[SHORT_READS], connections=connections)
        # A full collection walks every tracked object: with the engine's and the
        # libraries' millions of long-lived ones loaded it stalled the loop, every ack
        # with it, for 250-380 ms (bench/load.py). Frozen, those are left out of every
        # collection; what the service makes from now on is collected as before.
        # (No collection first: it would take as long, at every start of the tests' apps.)
        gc.freeze()
        # The keys in use are checked again in the background: a request finds its key
        # checked instead of waiting for its lookup once a second is up.
        key_checks = asyncio.create_task(
            keep_keys_fresh(app[SHORT_READS], sessions), name="keep_keys_fresh"
        )
        log.info("service_started", host=settings.server.host, port=settings.server.port)
        yield
        gc.unfreeze()  # another app may be made in this process (the tests make many)
        key_checks.cancel()
        await asyncio.gather(key_checks, return_exceptions=True)
        # ops.drain (on_shutdown) has drained the turns already; this is a no-op then.
        await turns.shutdown(settings.server.shutdown_grace_s)
        if turns.kept_accepts is not None:
            await turns.kept_accepts.close()  # checked out: back to the pool before it goes
        if policy.compactor is not None:
            await policy.compactor.close()  # background preparations, before the engine goes
        if policy.partials is not None:
            await policy.partials.close()
        log.info("service_stopping")
        await http.close()
        if starts_engine:
            await inference.shutdown()
        await engines.dispose()
        await db_probe.dispose()

    app.cleanup_ctx.append(lifetime)
    add_channels(app, settings, Wiring(settings.server, turns, http))
    web_page.setup(app)
    favicon.setup(app)
    openapi.setup(app)
    cors.setup(app, settings.server.cors_origins)
    return app
