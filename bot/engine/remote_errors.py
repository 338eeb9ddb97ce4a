"""How a remote vLLM server's failures map onto the error taxonomy, each with an operator hint.

A failure is also sorted by what may be done about it: ``failover`` means the
replica looks down or overloaded and the same request may go to the next
replica (only while nothing has been streamed to the user); otherwise the
request itself, the key or the model name is wrong and every replica would
answer the same.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import aiohttp

from bot.errors import EngineError, ErrorClass

_CONTEXT_WORDS = ("maximum context length", "max_model_len", "too long", "context length")


@dataclass(frozen=True)
class RemoteFailure:
    error: EngineError
    failover: bool
    """The replica is down or overloaded: another replica may serve the request."""
    trips_breaker: bool
    """Counts against the replica's circuit breaker."""


def _error_text(body: str) -> str:
    """The ``message`` of an OpenAI-style error body, else the body itself (shortened)."""
    try:
        document = json.loads(body)
    except ValueError:
        return body[:300]
    if isinstance(document, dict):
        error = document.get("error", document)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
        if isinstance(document.get("message"), str):
            return str(document["message"])[:300]
    return body[:300]


def from_status(
    status: int, body: str, base_url: str, model: str, served: list[str] | None = None
) -> RemoteFailure:
    """Classify a non-2xx answer of ``base_url``."""
    text = _error_text(body)
    if status in (401, 403):
        return RemoteFailure(
            EngineError(
                ErrorClass.AUTH,
                f"{base_url} refused the API key ({status}): {text}",
                hint="check engine.api_key (the server's --api-key)",
            ),
            failover=False,
            trips_breaker=False,
        )
    if status == 404:
        names = ", ".join(served) if served else "(could not list /v1/models)"
        return RemoteFailure(
            EngineError(
                ErrorClass.MODEL_NOT_FOUND,
                f"{base_url} does not serve model {model!r}: {text}",
                hint=f"set engine.served_model_name to one of the served models: {names}",
            ),
            failover=False,
            trips_breaker=False,
        )
    if status == 429:
        return RemoteFailure(
            EngineError(
                ErrorClass.RATE_LIMITED,
                f"{base_url} is rate limiting (429): {text}",
                hint="the replica is saturated: add replicas or lower the load",
            ),
            failover=True,
            trips_breaker=False,
        )
    if status >= 500:
        return RemoteFailure(
            EngineError(
                ErrorClass.ENGINE_UNAVAILABLE,
                f"{base_url} answered {status}: {text}",
                hint="the vLLM server is failing: see its own log",
            ),
            failover=True,
            trips_breaker=True,
        )
    if status == 400 and any(word in text.lower() for word in _CONTEXT_WORDS):
        return RemoteFailure(
            EngineError(ErrorClass.CONTEXT_OVERFLOW, f"{base_url}: {text}"),
            failover=False,
            trips_breaker=False,
        )
    return RemoteFailure(
        EngineError(
            ErrorClass.BAD_REQUEST if status < 500 else ErrorClass.UPSTREAM_PROTOCOL,
            f"{base_url} refused the request ({status}): {text}",
            hint="the server rejected the request: compare its vLLM version with this service's",
        ),
        failover=False,
        trips_breaker=False,
    )


# Transport failures, most specific first (the first three are ClientConnectorErrors):
# each means the replica is unreachable or unwell, so another replica may serve.
_TRANSPORT_FAILURES: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], ErrorClass, str, str], ...
] = (
    (
        aiohttp.ClientProxyConnectionError,
        ErrorClass.NETWORK,
        "proxy failed for {url}",
        "check HTTP(S)_PROXY / NO_PROXY for the engine's address",
    ),
    (
        aiohttp.ClientConnectorDNSError,
        ErrorClass.NETWORK,
        "cannot resolve {url}",
        "check the host name in engine.base_urls (DNS)",
    ),
    (
        aiohttp.ClientConnectorError,
        ErrorClass.NETWORK,
        "cannot connect to {url}",
        "is the vLLM server running? check engine.base_urls (host and port)",
    ),
    (
        (asyncio.TimeoutError, aiohttp.ServerTimeoutError),
        ErrorClass.TIMEOUT,
        "{url} did not answer in time",
        "the replica is overloaded or hung; engine.request_timeout_s bounds the wait",
    ),
    (
        # Disconnected mid-answer, reset, truncated payload: the server went away.
        aiohttp.ClientError,
        ErrorClass.ENGINE_UNAVAILABLE,
        "{url} dropped the connection",
        "the vLLM server restarted or crashed: see its own log",
    ),
)


def from_exception(exc: BaseException, base_url: str) -> RemoteFailure:
    """Classify a transport failure talking to ``base_url``."""
    detail = f"{type(exc).__name__}: {exc}"
    for types, error_class, what, hint in _TRANSPORT_FAILURES:
        if isinstance(exc, types):
            message = f"{what.format(url=base_url)}: {detail}"
            return RemoteFailure(
                EngineError(error_class, message, hint=hint), failover=True, trips_breaker=True
            )
    return RemoteFailure(
        EngineError(ErrorClass.INTERNAL, f"talking to {base_url}: {detail}"),
        failover=False,
        trips_breaker=False,
    )


def protocol_error(base_url: str, what: str) -> RemoteFailure:
    return RemoteFailure(
        EngineError(
            ErrorClass.UPSTREAM_PROTOCOL,
            f"{base_url} answered in an unexpected format: {what}",
            hint="do engine.base_urls point at vLLM OpenAI-compatible servers (not a proxy)?",
        ),
        failover=False,
        trips_breaker=False,
    )
