"""Typed application state (``web.AppKey``): what request handlers may reach."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bot.engine.base import InferenceEngine
from bot.engine.settings import EngineSettings
from bot.http.readers import EventStreamReaders
from bot.http.settings import ServerSettings
from bot.ops.recent_answer import RecentAnswer
from bot.storage.db import ServiceEngines
from bot.turns.chat_format import ChatFormatSource
from bot.turns.followers import TurnFollowers
from bot.turns.service import TurnService
from bot.turns.usage import UsageReports

SERVER = web.AppKey("server", ServerSettings)
ENGINE_SETTINGS = web.AppKey("engine_settings", EngineSettings)
"""The model the OpenAI-compatible routes serve and accept by name."""
SESSIONS = web.AppKey("sessions", async_sessionmaker[AsyncSession])
READ_SESSIONS = web.AppKey("read_sessions", async_sessionmaker[AsyncSession])
"""Sessions of handlers that only read: on SQLite they never wait for, or hold, the write lock."""
SHORT_READS = web.AppKey("short_reads", async_sessionmaker[AsyncSession])
"""Read-only sessions for the short reads on an ack's way (a key check), on the requests'
engine (a turn's own short reads have theirs on the turns'): on SQLite they run on the event
loop's thread, with no trip to aiosqlite's."""
TURNS = web.AppKey("turns", TurnService)
ENGINE = web.AppKey("engine", InferenceEngine)
HTTP_CLIENT = web.AppKey("http_client", aiohttp.ClientSession)
CHAT_FORMAT = web.AppKey("chat_format", ChatFormatSource)
DB_ENGINES = web.AppKey("db_engines", ServiceEngines)
"""The requests' and the turns' database engines (``bot.storage.db.ServiceEngines``)."""
DB_PROBE = web.AppKey("db_probe", AsyncEngine)
"""The readiness check's own database connection (``bot.storage.db.create_probe_engine``)."""
DB_ANSWERS = web.AppKey("db_answers", RecentAnswer)
"""When the request engine's last statement completed (``bot.storage.db.watch_answers``)."""
STREAM_READERS = web.AppKey("stream_readers", EventStreamReaders)
TURN_FOLLOWERS = web.AppKey("turn_followers", TurnFollowers)
USAGE = web.AppKey("usage", UsageReports)
"""Usage reports (``/stats``, ``GET /v1/usage``) on the read-only sessions."""

# Per-request values set by the middleware.
REQUEST_STARTED = web.RequestKey("request_started_perf", float)
REQUEST_RECEIVED_AT = web.RequestKey("request_received_at", float)
AUTH_MS = web.RequestKey("auth_ms", float)
"""How long the key gate (``bot.http.key_gate``) took: the ``auth`` layer of the turn's log line."""
