"""One Slack app's Web API calls, through slack_sdk, with failures as one typed error.

slack_sdk's ``AsyncWebClient`` does the HTTP (token in the Authorization
header, never in a URL); this module only narrows its answers to
``SlackCallError(method, error, retry_after)`` and maps Slack's error codes
onto our ``ErrorClass``. Its built-in retry handlers are switched off: the
reply sinks pace, and retry by the service's one policy
(``bot.channels.delivery_retry``) from the ``CallFailure`` each error carries.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.web.async_client import AsyncWebClient

from bot.channels.delivery_retry import CallFailure, Network, network_failure
from bot.channels.slack.settings import SlackAppSettings
from bot.errors import ErrorClass
from bot.ops.metrics import note_rate_limited

AUTH_ERRORS = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "token_revoked",
        "token_expired",
        "account_inactive",
        "missing_scope",
        "not_allowed_token_type",
        "team_access_not_granted",
    }
)
RATE_ERRORS = frozenset({"ratelimited", "rate_limited", "message_limit_exceeded"})
# Errors that will not go away by trying again: the reply cannot reach this place.
FATAL_DELIVERY_ERRORS = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "restricted_action",
        "restricted_action_read_only_channel",
        "restricted_action_thread_locked",
        "restricted_action_non_threadable_channel",
        "ekm_access_denied",
        "no_permission",
        "thread_not_found",
    }
)
# Local names for failures that never reached Slack's JSON.
NETWORK_ERROR = "network_error"
TIMEOUT_ERROR = "timeout"


def classify(error: str) -> ErrorClass:
    """Slack error code -> the turn's error class."""
    if error in AUTH_ERRORS:
        return ErrorClass.AUTH
    if error in RATE_ERRORS:
        return ErrorClass.RATE_LIMITED
    if error == NETWORK_ERROR:
        return ErrorClass.NETWORK
    if error == TIMEOUT_ERROR:
        return ErrorClass.TIMEOUT
    return ErrorClass.DELIVERY


class SlackCallError(Exception):
    """A Web API call that did not succeed. Carries no token and no message text."""

    def __init__(
        self,
        method: str,
        error: str,
        *,
        retry_after: float | None = None,
        status: int | None = None,
        network: Network | None = None,
    ) -> None:
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error
        self.retry_after = retry_after
        self.status = status
        self.network = network

    @property
    def error_class(self) -> ErrorClass:
        return classify(self.error)

    @property
    def failure(self) -> CallFailure:
        """What the retry policy decides on (Slack answers most refusals with HTTP 200)."""
        return CallFailure(status=self.status, retry_after=self.retry_after, network=self.network)

    @property
    def fatal(self) -> bool:
        """Nothing more, not even an apology, can be posted to this place."""
        return self.error_class is ErrorClass.AUTH or self.error in FATAL_DELIVERY_ERRORS


def _retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _ts(data: dict[str, Any], method: str) -> str:
    ts = data.get("ts")
    if not isinstance(ts, str) or not ts:
        raise SlackCallError(method, "invalid_response")
    return ts


def make_client(settings: SlackAppSettings, session: aiohttp.ClientSession) -> AsyncWebClient:
    return AsyncWebClient(
        token=settings.bot_token.get_secret_value(),
        base_url=settings.api_base_url,
        timeout=settings.api_timeout_s,
        session=session,
        retry_handlers=[],
    )


class SlackApi:
    """The Web API methods the Slack channel uses, for one app."""

    def __init__(self, client: AsyncWebClient, *, timeout_s: float) -> None:
        self._client = client
        # slack_sdk's own timeout only applies to sessions it creates; ours is shared.
        self._timeout_s = timeout_s

    async def _call(self, method: str, **args: Any) -> dict[str, Any]:
        name = method.replace(".", "_")
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await getattr(self._client, name)(**args)
        except SlackApiError as exc:
            data = exc.response.data if isinstance(exc.response.data, dict) else {}
            status = exc.response.status_code
            error = str(data.get("error") or f"http_{status}")
            retry_after = _retry_after(exc.response.headers) if status == 429 else None
            if status == 429:
                note_rate_limited("slack")
            if status == 429 and error not in RATE_ERRORS:
                error = "ratelimited"
            raise SlackCallError(method, error, retry_after=retry_after, status=status) from None
        except TimeoutError:
            raise SlackCallError(method, TIMEOUT_ERROR, network=Network.TIMEOUT) from None
        except (aiohttp.ClientError, SlackRequestError) as exc:
            raise SlackCallError(
                method, NETWORK_ERROR, network=network_failure(exc).network
            ) from exc
        data = response.data
        return data if isinstance(data, dict) else {}

    async def auth_test(self) -> dict[str, Any]:
        return await self._call("auth.test")

    async def users_info(self, user: str) -> dict[str, Any]:
        return await self._call("users.info", user=user)

    async def post_message(
        self,
        *,
        channel: str,
        text: str,
        thread_ts: str | None = None,
        blocks: list[dict[str, Any]] | None = None,
    ) -> str:
        data = await self._call(
            "chat.postMessage",
            channel=channel,
            text=text,
            thread_ts=thread_ts,
            mrkdwn=True,
            **({"blocks": blocks} if blocks else {}),
        )
        return _ts(data, "chat.postMessage")

    async def update(
        self, *, channel: str, ts: str, text: str, blocks: list[dict[str, Any]] | None = None
    ) -> None:
        await self._call(
            "chat.update",
            channel=channel,
            ts=ts,
            text=text,
            **({"blocks": blocks} if blocks else {}),
        )

    async def start_stream(
        self,
        *,
        channel: str,
        thread_ts: str,
        markdown_text: str,
        recipient_team_id: str | None,
        recipient_user_id: str | None,
    ) -> str:
        data = await self._call(
            "chat.startStream",
            channel=channel,
            thread_ts=thread_ts,
            markdown_text=markdown_text,
            recipient_team_id=recipient_team_id,
            recipient_user_id=recipient_user_id,
        )
        return _ts(data, "chat.startStream")

    async def append_stream(self, *, channel: str, ts: str, markdown_text: str) -> None:
        await self._call("chat.appendStream", channel=channel, ts=ts, markdown_text=markdown_text)

    async def stop_stream(self, *, channel: str, ts: str, markdown_text: str | None) -> None:
        await self._call("chat.stopStream", channel=channel, ts=ts, markdown_text=markdown_text)
