"""The outbound Bot API client of one bot: one call, paced, with its errors classified.

Every call goes through ``TelegramApi.call``: it waits for the chat's turn
(``pacing``), posts JSON on the service's one shared ``aiohttp.ClientSession``,
and turns a refusal into ``TelegramApiError`` with an ``ErrorClass``. A 429
blocks the chat for ``retry_after``. Callers that must deliver (the final
text, a command's notice) pass a ``DeliveryRetry``
(``bot.channels.delivery_retry``): a 429, a 5xx, a connection refused or
dropped, a timeout are then tried again within its budget
(``max_flood_wait_s``). Callers that can drop the call (a streamed preview,
typing) do not.

The token sits in the URL path, as the Bot API requires, so no URL and no
aiohttp exception text (which may quote the URL) ever reaches an error
message or a log line from here.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import structlog
from pydantic import SecretStr

from bot.channels.delivery_retry import CallFailure, DeliveryRetry, network_failure
from bot.channels.telegram.pacing import ChatPacer, PacingPolicy
from bot.channels.telegram.settings import TelegramBotSettings
from bot.errors import ErrorClass
from bot.ops.metrics import note_rate_limited

log = structlog.get_logger(__name__)

PACED_METHODS = frozenset({"sendMessage", "editMessageText", "sendMessageDraft"})
"""Methods that count against the per-chat message limits."""


class TelegramApiError(Exception):
    """The Bot API refused a call, or could not be reached."""

    def __init__(
        self,
        method: str,
        error_code: int,
        description: str,
        *,
        retry_after: float | None = None,
        error_class: ErrorClass | None = None,
        failure: CallFailure | None = None,
    ) -> None:
        super().__init__(f"telegram {method}: {error_code} {description}")
        self.method = method
        self.error_code = error_code
        self.description = description
        self.retry_after = retry_after
        self.error_class = error_class or classify(error_code)
        self.failure = failure or CallFailure(status=error_code, retry_after=retry_after)

    @property
    def is_not_modified(self) -> bool:
        return self.error_code == 400 and "message is not modified" in self.description

    @property
    def is_entity_error(self) -> bool:
        """Telegram could not parse the formatting (``parse_mode``) of the text."""
        return self.error_code == 400 and "can't parse entities" in self.description.lower()


def classify(error_code: int) -> ErrorClass:
    """Bot API error code -> error class.

    401 is a revoked or wrong token; 404 is what Telegram answers for a
    malformed token (the method URL does not exist): both mean our
    credentials, not the message, are at fault.
    """
    if error_code in (401, 404):
        return ErrorClass.AUTH
    if error_code == 429:
        return ErrorClass.RATE_LIMITED
    return ErrorClass.DELIVERY


def _chat_of(params: dict[str, Any]) -> int | None:
    chat_id = params.get("chat_id")
    return chat_id if isinstance(chat_id, int) else None


class TelegramApi:
    """Calls the Bot API as one bot."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        *,
        token: SecretStr,
        base_url: str,
        pacer: ChatPacer,
        timeout_s: float,
        max_flood_wait_s: float,
    ) -> None:
        self._http = http
        self._token = token
        self._base_url = base_url.rstrip("/")
        self.pacer = pacer
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_flood_wait_s = max_flood_wait_s

    @classmethod
    def from_settings(
        cls, http: aiohttp.ClientSession, settings: TelegramBotSettings
    ) -> TelegramApi:
        policy = PacingPolicy(
            private_min_interval_s=settings.private_min_interval_s,
            group_min_interval_s=settings.group_min_interval_s,
            global_max_calls_per_s=settings.global_max_calls_per_s,
        )
        return cls(
            http,
            token=settings.token,
            base_url=settings.api_base_url,
            pacer=ChatPacer(policy),
            timeout_s=settings.request_timeout_s,
            max_flood_wait_s=settings.max_flood_wait_s,
        )

    def new_retry(self, budget_s: float | None = None) -> DeliveryRetry:
        """The retry state of one reply (or one notice): ``max_flood_wait_s`` unless told."""
        return DeliveryRetry(self.max_flood_wait_s if budget_s is None else budget_s)

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        retry: DeliveryRetry | bool = False,
    ) -> Any:
        """Call ``method``; with ``retry`` (True: a fresh ``new_retry()``), transient failures
        are tried again within that reply's budget."""
        params = params or {}
        chat_id = _chat_of(params)
        paced = method in PACED_METHODS
        policy = self.new_retry() if retry is True else retry or None
        while True:
            await self.pacer.wait(chat_id, paced=paced)
            self.pacer.reserve(chat_id, paced=paced)
            try:
                result = await self._post(method, params)
            except TelegramApiError as exc:
                wait = self._after_failure(exc, chat_id, policy)
                if wait is None:
                    raise
                if exc.retry_after is None:
                    await asyncio.sleep(wait)
                # After a 429 the pacer holds the chat for retry_after: its wait is the wait.
                continue
            if policy is not None:
                policy.succeeded()
            return result

    def _after_failure(
        self, exc: TelegramApiError, chat_id: int | None, policy: DeliveryRetry | None
    ) -> float | None:
        """Seconds until the call is tried again, or None to raise ``exc``."""
        if exc.retry_after is not None:
            self.pacer.flood(chat_id, exc.retry_after)
            note_rate_limited("telegram")
        wait = policy.next_wait(exc.failure) if policy is not None else None
        if exc.retry_after is not None or wait is not None:
            log.warning(
                "telegram_call_retry" if wait is not None else "telegram_call_failed",
                method=exc.method,
                chat_id=chat_id,
                error_code=exc.error_code,
                network=exc.failure.network,
                retry_after=exc.retry_after,
                wait_s=None if wait is None else round(wait, 3),
                # A sendMessage whose answer was lost may be shown twice once retried.
                may_duplicate=wait is not None and exc.failure.may_have_landed,
            )
        return wait

    async def _post(self, method: str, params: dict[str, Any]) -> Any:
        url = f"{self._base_url}/bot{self._token.get_secret_value()}/{method}"
        try:
            async with self._http.post(url, json=params, timeout=self._timeout) as response:
                status = response.status
                try:
                    body = await response.json(content_type=None)
                except ValueError:
                    body = None
        except TimeoutError as exc:
            raise TelegramApiError(
                method,
                0,
                "no answer in time",
                error_class=ErrorClass.TIMEOUT,
                failure=network_failure(exc),
            ) from None
        except aiohttp.ClientError as exc:
            # ``from None``: the original's text may quote the URL, token included.
            raise TelegramApiError(
                method,
                0,
                f"cannot reach the Bot API ({type(exc).__name__})",
                error_class=ErrorClass.NETWORK,
                failure=network_failure(exc),
            ) from None
        if not isinstance(body, dict):
            raise TelegramApiError(method, status, "answer is not a JSON object")
        if body.get("ok") is True:
            return body.get("result")
        parameters = body.get("parameters") or {}
        retry_after = parameters.get("retry_after") if isinstance(parameters, dict) else None
        error_code = body.get("error_code")
        raise TelegramApiError(
            method,
            error_code if isinstance(error_code, int) else status,
            str(body.get("description", "")),
            retry_after=float(retry_after) if isinstance(retry_after, int | float) else None,
        )
