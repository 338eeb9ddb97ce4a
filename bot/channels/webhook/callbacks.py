"""Signed POSTs to an integration's callback URL, retried by the service's one policy.

Each attempt is signed afresh (the receiver's replay window counts from the
attempt, not from the first try) and carries the same ``X-Webhook-Delivery``
id, so a receiver can drop an attempt it already processed: that is what
makes a retry after a timeout or a dropped connection safe here. Retried
(``bot.channels.delivery_retry``): network errors, timeouts, 408, 425, 429
(after its ``Retry-After``) and 5xx, with backoff from ``retry_backoff_s``
while the reply's time lost to failures stays within ``retry_for_s``. Any other
answer is final: a 4xx means the receiver refuses the message, and retrying
would not change that. Redirects are not followed: a 3xx is such a final
answer too (a signed reply goes to the configured URL only, never where an
answer points it). A callback that cannot be delivered is
``DeliveryError(delivery)``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import structlog

from bot.channels.delivery_retry import (
    CallFailure,
    DeliveryRetry,
    network_failure,
    retry_after_header,
)
from bot.channels.webhook.settings import WebhookSettings
from bot.channels.webhook.signing import DELIVERY_HEADER, signed_headers
from bot.errors import DeliveryError, ErrorClass

log = structlog.get_logger(__name__)


class CallbackClient:
    """Delivers callback payloads of one integration. Never logs the URL (it may hold a token)."""

    def __init__(self, settings: WebhookSettings, http: aiohttp.ClientSession) -> None:
        self._settings = settings
        self._http = http
        self._secret = settings.secret.get_secret_value()
        self._timeout = aiohttp.ClientTimeout(total=settings.callback_timeout_s)

    def new_retry(self) -> DeliveryRetry:
        """The retry state of one reply's callbacks."""
        return DeliveryRetry(
            self._settings.retry_for_s, first_backoff_s=self._settings.retry_backoff_s
        )

    async def _attempt(self, body: bytes, delivery_id: str) -> CallFailure | None:
        """One POST: None once delivered, else how it failed."""
        headers = {
            "Content-Type": "application/json",
            DELIVERY_HEADER: delivery_id,
            **signed_headers(self._secret, body),
        }
        try:
            async with self._http.post(
                self._settings.callback_url,
                data=body,
                headers=headers,
                timeout=self._timeout,
                allow_redirects=False,
            ) as response:
                if 200 <= response.status < 300:
                    return None
                retry_after = retry_after_header(response.headers.get("Retry-After"))
                return CallFailure(status=response.status, retry_after=retry_after)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return network_failure(exc)

    async def deliver(
        self, payload: dict[str, Any], delivery_id: str, retry: DeliveryRetry
    ) -> None:
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        attempts = 0
        while True:
            attempts += 1
            failure = await self._attempt(body, delivery_id)
            if failure is None:
                retry.succeeded()
                if attempts > 1:
                    log.info(
                        "webhook_callback_recovered",
                        webhook=self._settings.name,
                        delivery=delivery_id,
                        attempts=attempts,
                    )
                return
            outcome = f"HTTP {failure.status}" if failure.status else str(failure.network)
            wait = retry.next_wait(failure)
            if wait is None:
                if not failure.transient:
                    raise DeliveryError(
                        ErrorClass.DELIVERY,
                        f"webhook {self._settings.name}: callback refused, {outcome}",
                    )
                raise DeliveryError(
                    ErrorClass.DELIVERY,
                    f"webhook {self._settings.name}: callback failed {attempts} times, "
                    f"{retry.lost_s:.1f} s lost of {self._settings.retry_for_s:g}, "
                    f"last: {outcome}",
                )
            log.warning(
                "webhook_callback_retry",
                webhook=self._settings.name,
                delivery=delivery_id,
                attempt=attempts,
                outcome=outcome,
                wait_s=round(wait, 3),
            )
            await asyncio.sleep(wait)
