"""Signed POSTs to an integration's callback URL, retried with backoff for a bounded time.

Each attempt is signed afresh (the receiver's replay window counts from the
attempt, not from the first try) and carries the same ``X-Webhook-Delivery``
id, so a receiver can drop an attempt it already processed. Retried: network
errors, timeouts, 408, 425, 429 and 5xx. Any other answer is final: a 4xx
means the receiver refuses the message, and retrying would not change that.
Redirects are not followed: a 3xx is such a final answer too (a signed reply
goes to the configured URL only, never where an answer points it).
When the retries add up to ``retry_for_s``, ``DeliveryError(delivery)``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import structlog

from bot.channels.webhook.settings import WebhookSettings
from bot.channels.webhook.signing import DELIVERY_HEADER, signed_headers
from bot.errors import DeliveryError, ErrorClass

log = structlog.get_logger(__name__)

MAX_BACKOFF_S = 8.0
RETRYABLE_STATUS = frozenset({408, 425, 429})


def _retryable(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


def _retry_after_s(response: aiohttp.ClientResponse) -> float | None:
    raw = response.headers.get("Retry-After", "")
    return float(raw) if raw.isdigit() else None


class CallbackClient:
    """Delivers callback payloads of one integration. Never logs the URL (it may hold a token)."""

    def __init__(self, settings: WebhookSettings, http: aiohttp.ClientSession) -> None:
        self._settings = settings
        self._http = http
        self._secret = settings.secret.get_secret_value()
        self._timeout = aiohttp.ClientTimeout(total=settings.callback_timeout_s)

    async def _attempt(self, body: bytes, delivery_id: str) -> tuple[bool, str, float | None]:
        """One POST: (delivered, outcome, server-requested wait). Raises on a final refusal."""
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
                    return True, f"HTTP {response.status}", None
                if not _retryable(response.status):
                    raise DeliveryError(
                        ErrorClass.DELIVERY,
                        f"webhook {self._settings.name}: callback refused, HTTP {response.status}",
                    )
                return False, f"HTTP {response.status}", _retry_after_s(response)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return False, type(exc).__name__, None

    async def deliver(self, payload: dict[str, Any], delivery_id: str) -> None:
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        deadline = time.monotonic() + self._settings.retry_for_s
        backoff = self._settings.retry_backoff_s
        attempts = 0
        while True:
            attempts += 1
            delivered, outcome, requested_wait = await self._attempt(body, delivery_id)
            if delivered:
                if attempts > 1:
                    log.info(
                        "webhook_callback_recovered",
                        webhook=self._settings.name,
                        delivery=delivery_id,
                        attempts=attempts,
                    )
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeliveryError(
                    ErrorClass.DELIVERY,
                    f"webhook {self._settings.name}: callback failed {attempts} times "
                    f"over {self._settings.retry_for_s:g} s, last: {outcome}",
                )
            wait = min(max(backoff, requested_wait or 0.0), remaining)
            log.warning(
                "webhook_callback_retry",
                webhook=self._settings.name,
                delivery=delivery_id,
                attempt=attempts,
                outcome=outcome,
                wait_s=round(wait, 3),
            )
            await asyncio.sleep(wait)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
