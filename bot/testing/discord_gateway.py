"""A fake of Discord's gateway: a real WebSocket server on loopback speaking its protocol.

What a client sees (Discord's "Gateway" docs): ``HELLO`` (op 10) with the
heartbeat interval on connect; ``IDENTIFY`` (op 2) with the bot token and
intents, answered by the ``READY`` dispatch (session id, resume URL, the bot's
user); heartbeats (op 1) acknowledged (op 11); ``RESUME`` (op 6) with the
session id and the last sequence number seen, answered by a replay of every
dispatch after it and ``RESUMED``. ``?compress=zlib-stream`` is honoured (one
zlib stream per connection, each message ending in a sync flush), as a client
library asks for it by default.

Tests ``dispatch`` events (``MESSAGE_CREATE``), ``drop`` the connection (close
code 4000: resumable) and read ``identifies``, ``resumes``, ``heartbeats`` and
``connections`` (each with the peer that made it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

HEARTBEAT_INTERVAL_MS = 1000
RESUMABLE_CLOSE = 4000
AUTHENTICATION_FAILED = 4004


@dataclass
class Connection:
    ws: web.WebSocketResponse
    compress: Any
    peer: str
    session_id: str | None = None


@dataclass
class Session:
    session_id: str
    intents: int
    sent: list[dict[str, Any]] = field(default_factory=list)
    """Every dispatch with its sequence number, for a resume's replay."""


class FakeDiscordGateway:
    def __init__(self, *, token: str, bot_user_id: str, application_id: str) -> None:
        self.token = token
        self.bot_user_id = bot_user_id
        self.application_id = application_id
        self.identifies: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.heartbeats = 0
        self.connections: list[str] = []
        """The peer (host:port) of every connection, in order."""
        self._live: Connection | None = None
        self._sessions: dict[str, Session] = {}
        self._seq = itertools.count(1)
        self._session_ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.connected = asyncio.Event()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/", self._serve)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"ws://127.0.0.1:{port}/"

    async def close(self) -> None:
        if self._live is not None:
            await self._live.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- what tests do --------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self._live is not None and self._live.session_id is not None

    async def dispatch(self, name: str, data: dict[str, Any]) -> None:
        """Send a dispatch to the session; kept for a resume's replay if nobody is connected."""
        session = self._current_session()
        payload = {"op": 0, "t": name, "s": next(self._seq), "d": data}
        session.sent.append(payload)
        if self._live is not None and self._live.session_id == session.session_id:
            await self._send(self._live, payload)

    async def drop(self) -> None:
        """End the connection as a network hiccup would: the client should resume."""
        if self._live is not None:
            live, self._live = self._live, None
            self.connected.clear()
            await live.ws.close(code=RESUMABLE_CLOSE, message=b"dropped by the test")

    def _current_session(self) -> Session:
        if not self._sessions:
            raise AssertionError("no client has identified yet")
        return list(self._sessions.values())[-1]

    # -- the protocol -----------------------------------------------------------------

    async def _send(self, connection: Connection, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        if connection.compress is None:
            await connection.ws.send_str(data.decode())
        else:
            chunk = connection.compress.compress(data) + connection.compress.flush(
                zlib.Z_SYNC_FLUSH
            )
            await connection.ws.send_bytes(chunk)

    async def _serve(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        compress = zlib.compressobj() if request.query.get("compress") == "zlib-stream" else None
        peer = request.transport.get_extra_info("peername") if request.transport else None
        connection = Connection(ws, compress, f"{peer[0]}:{peer[1]}" if peer else "?")
        self.connections.append(connection.peer)
        await self._send(connection, {"op": 10, "d": {"heartbeat_interval": HEARTBEAT_INTERVAL_MS}})
        async for message in ws:
            if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue  # Discord takes a payload as a text or a binary frame
            payload = json.loads(message.data)
            op, data = payload.get("op"), payload.get("d")
            if op == 1:
                self.heartbeats += 1
                await self._send(connection, {"op": 11})
            elif op == 2:
                await self._identify(connection, data)
            elif op == 6:
                await self._resume(connection, data)
        if self._live is connection:
            self._live = None
            self.connected.clear()
        return ws

    async def _identify(self, connection: Connection, data: dict[str, Any]) -> None:
        if data.get("token") not in (self.token, f"Bot {self.token}"):
            await connection.ws.close(code=AUTHENTICATION_FAILED, message=b"Authentication failed")
            return
        self.identifies.append({"intents": data.get("intents"), "peer": connection.peer})
        session = Session(f"session-{next(self._session_ids)}", int(data.get("intents") or 0))
        self._sessions[session.session_id] = session
        connection.session_id = session.session_id
        self._live = connection
        ready = {
            "v": 10,
            "user": {
                "id": self.bot_user_id,
                "username": "testbot",
                "discriminator": "0",
                "global_name": None,
                "avatar": None,
                "bot": True,
                "verified": True,
                "mfa_enabled": False,
                "flags": 0,
            },
            "guilds": [],
            "session_id": session.session_id,
            "resume_gateway_url": self.url,
            "shard": [0, 1],
            "application": {"id": self.application_id, "flags": 0},
        }
        payload = {"op": 0, "t": "READY", "s": next(self._seq), "d": ready}
        session.sent.append(payload)
        await self._send(connection, payload)
        self.connected.set()

    async def _resume(self, connection: Connection, data: dict[str, Any]) -> None:
        session = self._sessions.get(data.get("session_id", ""))
        if session is None or data.get("token") not in (self.token, f"Bot {self.token}"):
            await self._send(connection, {"op": 9, "d": False})  # invalid session
            return
        self.resumes.append({"seq": data.get("seq"), "peer": connection.peer})
        connection.session_id = session.session_id
        self._live = connection
        last = data.get("seq") or 0
        for payload in session.sent:
            if payload["s"] > last:
                await self._send(connection, payload)
        await self._send(connection, {"op": 0, "t": "RESUMED", "s": next(self._seq), "d": {}})
        self.connected.set()
