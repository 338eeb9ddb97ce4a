"""One Discord application's HTTP calls, each through ``DiscordApi.send``.

Every outbound call (the reply's edits and follow-ups, messages in channels,
registering commands, the doctor's look-ups) goes through the one ``send``:
it waits while the call's bucket is known to be empty or a 429's
``retry_after`` runs, makes the request, reads Discord's ``X-RateLimit-*``
headers into the shared ``Pacer`` and turns a failure into one
``DiscordCallError``. It does not retry: the caller (a reply sink) knows
whether a call is still worth making and holds the reply's ``DeliveryRetry``
(``bot.channels.delivery_retry``), fed by the ``CallFailure`` each error carries.

Rate limits are per route and per "major parameter" (a channel, a webhook
and its token); a 429's JSON body says for how long (``retry_after``,
seconds) and whether the whole application is limited (``global``). The
bot token goes in the ``Authorization`` header; an interaction's token is
part of its webhook's URL, as Discord's API has it, so no URL is ever logged
or put in an error: errors name the route's template.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bot.channels.delivery_retry import CallFailure, Network, network_failure
from bot.channels.discord.settings import DiscordBotSettings
from bot.channels.slack.pacing import Pacer
from bot.errors import ErrorClass
from bot.ops.metrics import note_rate_limited

GLOBAL_KEY = "global"
DEFAULT_RETRY_AFTER_S = 1.0
"""A 429 that names no wait (Discord always does; a proxy might not)."""
UNKNOWN_WEBHOOK = 10015
"""Discord's JSON error code for a webhook (an interaction's, here) it does not know (yet)."""
NETWORK_ERROR = "network_error"
TIMEOUT_ERROR = "timeout"


@dataclass(frozen=True)
class Call:
    """One request: ``route`` is the template that names it in logs and errors."""

    method: str
    route: str
    path: str
    major: str
    """The route's major parameter (a channel id, a webhook token's hash): its bucket."""
    json: Any = None
    bot_auth: bool = True
    """Send the bot token; webhook calls with an interaction token carry none."""
    query: dict[str, str] = field(default_factory=dict)

    @property
    def bucket(self) -> Hashable:
        return (self.method, self.route, self.major)


class DiscordCallError(Exception):
    """A call that did not succeed. Carries no token, no URL and no message text."""

    def __init__(
        self,
        route: str,
        *,
        status: int | None,
        code: int | None = None,
        error: str | None = None,
        retry_after: float | None = None,
        network: Network | None = None,
    ) -> None:
        what = error or (f"HTTP {status}" + (f" code {code}" if code is not None else ""))
        super().__init__(f"{route}: {what}")
        self.route = route
        self.status = status
        self.code = code
        self.error = error
        self.retry_after = retry_after
        self.network = network

    @property
    def error_class(self) -> ErrorClass:
        if self.status == 401:
            return ErrorClass.AUTH
        if self.status == 429:
            return ErrorClass.RATE_LIMITED
        if self.error == NETWORK_ERROR:
            return ErrorClass.NETWORK
        if self.error == TIMEOUT_ERROR:
            return ErrorClass.TIMEOUT
        return ErrorClass.DELIVERY

    @property
    def failure(self) -> CallFailure:
        return CallFailure(status=self.status, retry_after=self.retry_after, network=self.network)

    @property
    def fatal(self) -> bool:
        """Nothing more, not even an apology, can be sent there."""
        return self.status in (401, 403, 404)


def token_key(token: str) -> str:
    """A webhook token's bucket key: its hash, so the token itself is kept nowhere else."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, number) if number == number else None  # NaN is no wait


class DiscordApi:
    def __init__(
        self, http: aiohttp.ClientSession, settings: DiscordBotSettings, pacer: Pacer | None = None
    ) -> None:
        self._http = http
        self.settings = settings
        self._base = settings.api_base_url.rstrip("/")
        self.pacer = pacer or Pacer()
        self._timeout = aiohttp.ClientTimeout(total=settings.request_timeout_s)

    def delay(self, bucket: Hashable) -> float:
        """Seconds until a call in ``bucket`` may go (an empty bucket, a 429's wait)."""
        return max(self.pacer.delay(GLOBAL_KEY), self.pacer.delay(bucket))

    async def send(self, call: Call, *, interval: float = 0.0) -> Any:
        """Make ``call`` once its bucket allows, holding ``interval`` seconds after it for the
        next call of the same bucket; the JSON answer (None for 204)."""
        await self.pacer.wait(GLOBAL_KEY, 0.0)
        await self.pacer.wait(call.bucket, interval)
        headers = {"User-Agent": "DiscordBot (llm-chat-bot, 0.1)"}
        if call.bot_auth:
            headers["Authorization"] = f"Bot {self.settings.token.get_secret_value()}"
        url = f"{self._base}{call.path}"
        try:
            async with self._http.request(
                call.method,
                url,
                json=call.json,
                params=call.query or None,
                headers=headers,
                timeout=self._timeout,
            ) as response:
                self._note_bucket(call, response.headers)
                document = await _json(response)
                if response.status == 429:
                    raise self._rate_limited(call, response.headers, document)
                if response.status >= 400:
                    code = document.get("code") if isinstance(document, dict) else None
                    raise DiscordCallError(
                        call.route,
                        status=response.status,
                        code=code if isinstance(code, int) else None,
                    )
                return document
        except TimeoutError:
            raise DiscordCallError(
                call.route, status=None, error=TIMEOUT_ERROR, network=Network.TIMEOUT
            ) from None
        except aiohttp.ClientError as exc:
            # The exception's text may hold the URL, and with it a webhook token.
            raise DiscordCallError(
                call.route,
                status=None,
                error=NETWORK_ERROR,
                network=network_failure(exc).network,
            ) from None

    def _note_bucket(self, call: Call, headers: Any) -> None:
        """An emptied bucket: no call of it before it resets (``X-RateLimit-Reset-After``)."""
        remaining = _float(headers.get("X-RateLimit-Remaining"))
        reset_after = _float(headers.get("X-RateLimit-Reset-After"))
        if remaining is not None and remaining < 1 and reset_after:
            self.pacer.block(call.bucket, reset_after)

    def _rate_limited(self, call: Call, headers: Any, document: Any) -> DiscordCallError:
        body = document if isinstance(document, dict) else {}
        retry_after = _float(body.get("retry_after"))
        if retry_after is None:
            retry_after = _float(headers.get("Retry-After"))
        if retry_after is None:
            retry_after = DEFAULT_RETRY_AFTER_S
        is_global = body.get("global") is True or headers.get("X-RateLimit-Global") == "true"
        self.pacer.block(GLOBAL_KEY if is_global else call.bucket, retry_after)
        note_rate_limited("discord")
        return DiscordCallError(call.route, status=429, retry_after=retry_after)


async def _json(response: aiohttp.ClientResponse) -> Any:
    if response.status == 204:
        return None
    try:
        return await response.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        return None
