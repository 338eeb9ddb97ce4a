"""One retry policy for every platform call that carries a reply.

A platform client describes a failed call as a ``CallFailure`` (the HTTP
status it got, the platform's own ``retry_after``, or how the connection
failed); one ``DeliveryRetry`` per reply decides whether to try again and
after how long:

- transient: HTTP 408, 425, 429 and 5xx, a connection refused or dropped, a
  timeout. Anything else (401, 403, 404, a 400 about the message...) is final:
  trying again would get the same answer.
- the wait: the platform's ``retry_after`` / ``Retry-After`` when it gave one,
  else exponential backoff (``first_backoff_s`` doubling up to
  ``max_backoff_s``) with jitter, so replies that failed together do not all
  come back at the same instant.
- the budget: the time a reply loses to failures (from a call's first failure
  to its success, over all its calls) stays within ``budget_s`` (the
  platform's ``max_retry_wait_s`` / ``max_flood_wait_s`` / ``retry_for_s``); a
  wait that would pass it is not made, and the reply fails.

What a retry may repeat: a call refused with a status (5xx, 429) is taken to
have done nothing. A call whose answer never came (a timeout, a connection
dropped after the request went out) may have been carried out all the same:
Telegram may have shown the ``sendMessage``, Slack posted the message.
Such a call is retried too (``may_have_landed`` says so, and the clients log
it): a reply shown twice can be read, a reply lost cannot. Edits
(``editMessageText``, ``chat.update``, Discord's PATCH) repeat harmlessly, and
webhook callbacks carry the same ``X-Webhook-Delivery`` id on every attempt so
the receiver drops a repeat.
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
RETRYABLE_STATUS = frozenset({408, 425, 429})


class Network(enum.StrEnum):
    """How a call failed without an answer."""

    REFUSED = "refused"
    """No connection: the request never went out."""
    DROPPED = "dropped"
    """The connection broke after the request may have gone out."""
    TIMEOUT = "timeout"
    """No answer in time; the platform may still have carried the call out."""


@dataclass(frozen=True)
class CallFailure:
    """What a platform client knows about one failed call."""

    status: int | None = None
    """The HTTP status (or the platform's error code) when the platform answered."""
    retry_after: float | None = None
    """The platform's own "try again in" (a 429's ``retry_after``, a ``Retry-After``)."""
    network: Network | None = None

    @property
    def transient(self) -> bool:
        if self.network is not None or self.retry_after is not None:
            return True
        return self.status is not None and (self.status in RETRYABLE_STATUS or self.status >= 500)

    @property
    def may_have_landed(self) -> bool:
        """The platform may have carried the call out although no answer said so."""
        return self.network in (Network.DROPPED, Network.TIMEOUT)


def network_failure(exc: BaseException) -> CallFailure:
    """The ``CallFailure`` of an aiohttp client exception or a timeout."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return CallFailure(network=Network.TIMEOUT)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return CallFailure(network=Network.REFUSED)
    return CallFailure(network=Network.DROPPED)


def retry_after_header(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds; an HTTP date is not used)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.0, seconds) if seconds == seconds else None  # NaN is no wait


class DeliveryRetry:
    """The retry state of one reply: its budget, the streak of failures of its current call."""

    def __init__(
        self,
        budget_s: float,
        *,
        first_backoff_s: float = FIRST_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.budget_s = budget_s
        self._first_backoff_s = first_backoff_s
        self._max_backoff_s = max(max_backoff_s, first_backoff_s)
        self._clock = clock
        self._jitter = jitter
        self._lost_s = 0.0
        self._failing_since: float | None = None
        self.failures = 0
        """Failed attempts of the current call."""
        self.retries = 0
        """Retries of the whole reply."""

    @property
    def lost_s(self) -> float:
        """Time the reply has lost to failures so far."""
        streak = 0.0 if self._failing_since is None else self._clock() - self._failing_since
        return self._lost_s + streak

    def given_up(self) -> str:
        """What a give-up adds to its error: the time the retries cost, when there were any."""
        return f"; lost {self.lost_s:.0f} s to failures" if self.retries else ""

    def next_wait(self, failure: CallFailure) -> float | None:
        """Seconds to wait before trying the call again, or None: give up."""
        if not failure.transient:
            return None
        if self._failing_since is None:
            self._failing_since = self._clock()
        self.failures += 1
        if failure.retry_after is not None:
            wait = failure.retry_after
        else:
            backoff = min(self._first_backoff_s * 2 ** (self.failures - 1), self._max_backoff_s)
            # Half fixed, half random: never a busy loop, never all at once.
            wait = backoff * (0.5 + 0.5 * self._jitter())
        if self.lost_s + wait > self.budget_s:
            return None
        self.retries += 1
        return wait

    def succeeded(self) -> None:
        """The call went through: its streak of failures ends."""
        if self._failing_since is not None:
            self._lost_s += self._clock() - self._failing_since
            self._failing_since = None
        self.failures = 0
