"""Remote vLLM servers (OpenAI-compatible API) as one ``InferenceEngine``, with chat affinity.

Prompts stay token-exact over the wire: ``POST /v1/completions`` with the
prompt as a list of token ids and ``return_token_ids`` so the generated ids
come back as the engine produced them (never re-tokenized from text). The
cached-token count comes from ``usage.prompt_tokens_details.cached_tokens``
(servers run with ``--enable-prompt-tokens-details``; vLLM leaves it out
when it is 0) and engine timings from the per-request ``metrics``
(``--enable-per-request-metrics``).

Routing: ``bot.engine.routing`` ranks the replicas per conversation; a
request goes to the first one whose breaker is closed, and fails over down
the ranking only while nothing has been streamed to the user. The
conversation also travels as a session header, so a vLLM router in front
keeps the same affinity: with one base URL (the router's) the service has
nothing to rank, every try goes there and the router picks the replica
(``ReplicaSet.routing``). Each call is counted by upstream
(``bot.engine.upstream_metrics``).

Connections: a streaming turn holds one connection for its whole reply, so
the generation pool is sized from ``engine.max_connections`` (not aiohttp's
default of 100), and waiting for a free connection is queueing, not a
failure: ``connect_timeout_s`` bounds the TCP connect alone (``sock_connect``)
and ``request_timeout_s`` the server's silence (``sock_read``). Health checks
and model listings have a small pool of their own, so ``/readyz`` never waits
behind the streams. Platform clients (Telegram, Slack, webhook callbacks) use
the app's client (``bot.http.clients``), never these pools.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any, TypedDict

import aiohttp
import structlog
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from bot.engine.base import EngineTimings, GenerationChunk, GenerationRequest
from bot.engine.remote_errors import RemoteFailure, from_exception, from_status, protocol_error
from bot.engine.routing import ReplicaSet
from bot.engine.settings import EngineSettings
from bot.engine.upstream_metrics import UpstreamMetrics
from bot.errors import EngineError, ErrorClass
from bot.ops.recent_answer import RecentAnswer

log = structlog.get_logger(__name__)

MODELS_TIMEOUT_S = 5.0
CONTROL_CONNECTIONS = 4
"""Pool of the health checks and model listings: a few short requests, never behind streams."""


class _Failed(Exception):
    """Internal: one attempt failed in a classified way."""

    def __init__(self, failure: RemoteFailure) -> None:
        super().__init__(failure.error.message)
        self.failure = failure


def _timings(metrics: Any) -> EngineTimings | None:
    """vLLM's per-request metrics: queue, then first token after scheduling (prefill), decode."""
    if not isinstance(metrics, dict) or metrics.get("time_to_first_token_ms") is None:
        return None
    return EngineTimings(
        queue_ms=float(metrics.get("queue_time_ms") or 0.0),
        prefill_ms=float(metrics["time_to_first_token_ms"]),
        decode_ms=float(metrics.get("generation_time_ms") or 0.0),
    )


def _cached_tokens(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details") or {}
    # vLLM omits the field when nothing came from the cache.
    return int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0


class _Proxy(TypedDict, total=False):
    """aiohttp's request arguments for a replica's proxy; empty to dial it directly."""

    proxy: URL
    proxy_auth: aiohttp.BasicAuth | None


def _proxy_from_env(base_url: str) -> _Proxy:
    """The proxy that HTTP(S)_PROXY names for ``base_url``, unless NO_PROXY exempts it."""
    try:
        proxy, proxy_auth = get_env_proxy_for_url(URL(base_url))
    except LookupError:
        return {}
    return {"proxy": proxy, "proxy_auth": proxy_auth}


class OpenAIRemoteEngine:
    """``InferenceEngine`` over one or more vLLM OpenAI-compatible servers."""

    def __init__(self, settings: EngineSettings) -> None:
        if not settings.base_urls:
            raise EngineError(
                ErrorClass.INTERNAL,
                "engine.kind = 'openai' needs engine.base_urls",
                hint="list the vLLM servers, e.g. base_urls = ['http://10.0.0.5:8000']",
            )
        self._settings = settings
        self.max_model_len = settings.max_model_len
        self.model = settings.served_model_name or settings.model
        self.replicas = ReplicaSet(
            settings.base_urls,
            breaker_failures=settings.breaker_failures,
            breaker_cooldown_s=settings.breaker_cooldown_s,
        )
        self._http: aiohttp.ClientSession | None = None
        self._control: aiohttp.ClientSession | None = None
        self._in_flight: dict[str, aiohttp.ClientResponse] = {}
        self._streamed = RecentAnswer()
        self._proxies: dict[str, _Proxy] = {}
        self.upstream_metrics = UpstreamMetrics()

    # -- lifetime ----------------------------------------------------------------------

    async def start(self) -> None:
        if self._http is not None:
            return
        settings = self._settings
        headers = {}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        # sock_read, not total: a long reply may stream for minutes, but a silent
        # server must not hold a turn for longer than request_timeout_s. sock_connect,
        # not connect: aiohttp's connect timeout also counts the wait for a pooled
        # connection, which under load is a queue, not a fault of the replica.
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=None,
            sock_connect=settings.connect_timeout_s,
            sock_read=settings.request_timeout_s,
        )
        # HTTP(S)_PROXY / NO_PROXY apply as for any other client on the host, read once
        # per replica here: with trust_env aiohttp reads them, and ~/.netrc, in a worker
        # thread at every request, two thread hops on the way to every first token.
        self._proxies = {url: _proxy_from_env(url) for url in self.replicas.base_urls}
        self._http = aiohttp.ClientSession(
            headers=headers,
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit=settings.max_connections, limit_per_host=0),
        )
        self._control = aiohttp.ClientSession(
            headers=headers,
            connector=aiohttp.TCPConnector(limit=CONTROL_CONNECTIONS),
        )
        await asyncio.gather(*(self._probe(url) for url in self.replicas.base_urls))
        log.info(
            "engine_started",
            kind="openai",
            model=self.model,
            replicas=self.replicas.base_urls,
            routing=self.replicas.routing,
        )

    async def _probe(self, base_url: str) -> None:
        """Log at start-up whether a replica serves our model; a down replica is not fatal."""
        try:
            served = await self._served_models(base_url)
        except EngineError as exc:
            log.warning("replica_unreachable", base_url=base_url, error=exc.message, hint=exc.hint)
            return
        names = [str(model.get("id")) for model in served]
        if self.model not in names:
            log.error(
                "replica_lacks_model",
                base_url=base_url,
                model=self.model,
                served=names,
                hint="set engine.served_model_name to one of the served models",
            )
            return
        for model in served:
            limit = model.get("max_model_len")
            if (
                model.get("id") == self.model
                and isinstance(limit, int)
                and limit < self.max_model_len
            ):
                # Refuse overlong prompts here, with a clean context_overflow.
                self.max_model_len = limit

    async def _served_models(self, base_url: str) -> list[dict[str, Any]]:
        try:
            async with self.control.get(
                f"{base_url}/v1/models",
                timeout=aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S),
                **self._proxy(base_url),
            ) as response:
                body = await response.text()
                if response.status != 200:
                    raise from_status(response.status, body, base_url, self.model).error
        except aiohttp.ClientError as exc:
            raise from_exception(exc, base_url).error from exc
        except TimeoutError as exc:
            raise from_exception(exc, base_url).error from exc
        try:
            data = json.loads(body)["data"]
        except (ValueError, KeyError, TypeError) as exc:
            raise protocol_error(base_url, "/v1/models has no 'data' list").error from exc
        return [model for model in data if isinstance(model, dict)]

    def _proxy(self, base_url: str) -> _Proxy:
        return self._proxies.get(base_url) or {}

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "the engine has not been started")
        return self._http

    @property
    def control(self) -> aiohttp.ClientSession:
        """The client of health checks and model listings (its own pool)."""
        if self._control is None:
            raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, "the engine has not been started")
        return self._control

    async def shutdown(self) -> None:
        if self._control is not None:
            control, self._control = self._control, None
            await control.close()
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()
            log.info("engine_stopped", kind="openai")

    async def check_health(self) -> None:
        """Healthy when a replica streamed to us a moment ago or answers ``/health``.

        The stream counts first: under load a ``/health`` request waits behind the
        replica's busy event loop (and ours) and may miss the check's timeout while the
        replica serves every request (``bot.ops.recent_answer``).
        """
        if self._streamed.fresh():
            return
        problems = []
        for base_url in self.replicas.base_urls:
            try:
                async with self.control.get(
                    f"{base_url}/health",
                    timeout=aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S),
                    **self._proxy(base_url),
                ) as response:
                    if response.status == 200:
                        return
                    problems.append(f"{base_url}: {response.status}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                problems.append(f"{base_url}: {type(exc).__name__}")
        raise EngineError(
            ErrorClass.ENGINE_UNAVAILABLE, "no replica is healthy: " + "; ".join(problems)
        )

    async def abort(self, request_id: str) -> None:
        # Closing the connection is how an OpenAI client aborts: vLLM frees the slot.
        response = self._in_flight.pop(request_id, None)
        if response is not None:
            response.close()

    # -- generation --------------------------------------------------------------------

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(request.prompt_token_ids),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if request.stop:
            body["stop"] = list(request.stop)
        if request.presence_penalty:
            body["presence_penalty"] = request.presence_penalty
        if request.frequency_penalty:
            body["frequency_penalty"] = request.frequency_penalty
        if request.cache_salt:
            body["cache_salt"] = request.cache_salt
        if request.priority:
            # Honoured by servers started with `--scheduling-policy priority`; vLLM's
            # first-come-first-served scheduler accepts it and ignores it.
            body["priority"] = request.priority
        return body

    def _headers(self, request: GenerationRequest) -> dict[str, str]:
        headers = {"X-Request-Id": request.request_id}
        if request.session_key:
            headers[self._settings.session_header] = request.session_key
        return headers

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream from the conversation's replica; retry / fail over only before the first chunk."""
        settings = self._settings
        candidates = self.replicas.candidates(request.session_key, request.request_id)
        last: RemoteFailure | None = None
        attempt = 0
        index = 0
        while attempt < settings.max_attempts:
            base_url = candidates[index % len(candidates)]
            attempt += 1
            streamed = False
            try:
                async for chunk in self._attempt(base_url, request):
                    streamed = True
                    if chunk.finished:
                        self.upstream_metrics.succeeded(
                            base_url, chunk.prompt_tokens or 0, chunk.cached_tokens or 0
                        )
                    yield chunk
                self.replicas.breakers[base_url].record_success()
                return
            except _Failed as failed:
                last = failed.failure
            self.upstream_metrics.failed(base_url, last.error.error_class.value)
            breaker = self.replicas.breakers[base_url]
            if last.trips_breaker:
                breaker.record_failure()
            log.warning(
                "engine_attempt_failed",
                base_url=base_url,
                attempt=attempt,
                error_class=last.error.error_class.value,
                error=last.error.message,
                hint=last.error.hint,
                breaker=breaker.state,
                streamed=streamed,
            )
            if streamed or not last.failover:
                # Text already reached the user, or every replica would say the same.
                raise last.error
            if last.error.error_class is not ErrorClass.RATE_LIMITED:
                # A down replica: the next one in this conversation's ranking takes over.
                index += 1
            if attempt < settings.max_attempts:
                # Full jitter, so workers that failed together do not retry together.
                await asyncio.sleep(
                    random.uniform(0, settings.retry_backoff_s * 2 ** (attempt - 1))
                )
        assert last is not None
        raise last.error

    async def _attempt(
        self, base_url: str, request: GenerationRequest
    ) -> AsyncIterator[GenerationChunk]:
        try:
            async with self.http.post(
                f"{base_url}/v1/completions",
                json=self._body(request),
                headers=self._headers(request),
                **self._proxy(base_url),
            ) as response:
                if response.status != 200:
                    body = await response.text()
                    served: list[str] | None = None
                    if response.status == 404:
                        served = await self._served_names(base_url)
                    raise _Failed(from_status(response.status, body, base_url, self.model, served))
                if not response.content_type.startswith("text/event-stream"):
                    raise _Failed(
                        protocol_error(base_url, f"content type {response.content_type!r}, not SSE")
                    )
                # The stream opened: the replica answers, before its first token (which
                # can wait behind a long queue of prefills).
                self._streamed.saw()
                self._in_flight[request.request_id] = response
                try:
                    async for chunk in self._read_stream(base_url, request, response):
                        yield chunk
                finally:
                    self._in_flight.pop(request.request_id, None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Failed(from_exception(exc, base_url)) from exc

    async def _served_names(self, base_url: str) -> list[str] | None:
        try:
            return [str(model.get("id")) for model in await self._served_models(base_url)]
        except EngineError:
            return None

    async def _read_stream(
        self, base_url: str, request: GenerationRequest, response: aiohttp.ClientResponse
    ) -> AsyncIterator[GenerationChunk]:
        finish_reason: str | None = None
        usage: dict[str, Any] | None = None
        metrics: Any = None
        async for raw in response.content:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line or line.startswith(":") or not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            try:
                event = json.loads(data)
            except ValueError as exc:
                raise _Failed(
                    protocol_error(base_url, f"stream event is not JSON: {data[:80]!r}")
                ) from exc
            if not isinstance(event, dict):
                raise _Failed(protocol_error(base_url, "stream event is not a JSON object"))
            if "error" in event:
                error = event["error"] if isinstance(event["error"], dict) else {}
                status = (
                    int(error.get("code") or 500) if str(error.get("code", "")).isdigit() else 500
                )
                raise _Failed(from_status(status, json.dumps(event), base_url, self.model))
            if not isinstance(event.get("choices"), list):
                raise _Failed(protocol_error(base_url, "stream event has no 'choices'"))
            self._streamed.saw()
            if isinstance(event.get("usage"), dict):
                usage = event["usage"]
                metrics = event.get("metrics")
            for choice in event["choices"]:
                token_ids = choice.get("token_ids")
                if token_ids is None and choice.get("text"):
                    raise _Failed(
                        protocol_error(
                            base_url, "no 'token_ids' in a chunk (return_token_ids ignored)"
                        )
                    )
                if choice.get("finish_reason"):
                    finish_reason = str(choice["finish_reason"])
                if token_ids or choice.get("text"):
                    yield GenerationChunk(
                        token_ids=list(token_ids or []), text=str(choice.get("text") or "")
                    )
        if finish_reason is None:
            raise _Failed(
                RemoteFailure(
                    EngineError(
                        ErrorClass.ENGINE_UNAVAILABLE,
                        f"{base_url} ended the stream before the reply was finished",
                        hint="the vLLM server stopped mid-request: see its own log",
                    ),
                    failover=True,
                    trips_breaker=True,
                )
            )
        if usage is None:
            raise _Failed(
                protocol_error(base_url, "no usage in the stream (stream_options ignored)")
            )
        yield GenerationChunk(
            token_ids=[],
            text="",
            finished=True,
            finish_reason=finish_reason,
            prompt_tokens=int(usage.get("prompt_tokens") or len(request.prompt_token_ids)),
            cached_tokens=_cached_tokens(usage),
            timings=_timings(metrics),
        )
