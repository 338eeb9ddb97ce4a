"""Doctor check of a remote OpenAI-compatible engine (vLLM's server), over plain HTTP.

Two requests per server: ``GET {base}/v1/models`` (reachable? key accepted?
model served?) and a one-token ``POST {base}/v1/completions`` with a prompt of
token ids, the way the service sends prompts. Each failure is named with the
same error classes turns use, and a hint for the usual cause.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from bot.errors import DoctorFailure, ErrorClass

_HINTS = {
    ErrorClass.AUTH: "engine.api_key does not match the server's --api-key (BOT_ENGINE__API_KEY)",
    ErrorClass.MODEL_NOT_FOUND: (
        "engine.served_model_name (or engine.model) must be a name in the server's /v1/models"
    ),
    ErrorClass.NETWORK: (
        "wrong host or port in engine.base_urls, the server is down, or a proxy "
        "(HTTP_PROXY/HTTPS_PROXY/NO_PROXY) is in the way"
    ),
    ErrorClass.TIMEOUT: "the server took the connection but did not answer: overloaded or stuck",
    ErrorClass.UPSTREAM_PROTOCOL: (
        "this address does not speak the OpenAI API: base_url is the server root "
        "(http://host:8000, no /v1), and not a proxy's or another service's port"
    ),
    ErrorClass.ENGINE_UNAVAILABLE: "the server answered 5xx: still loading the model, or failing",
}


def _fail(error_class: ErrorClass, message: str) -> DoctorFailure:
    return DoctorFailure(error_class.value, message, _HINTS.get(error_class))


async def _request(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    payload: dict[str, Any] | None = None,
) -> tuple[int, Any]:
    """Status and parsed JSON body; transport failures become classified DoctorFailures."""
    try:
        async with http.request(method, url, headers=headers, json=payload) as response:
            raw = await response.read()
            status = response.status
    except TimeoutError:
        raise _fail(ErrorClass.TIMEOUT, f"{method} {url}: no answer in time") from None
    except aiohttp.ClientConnectorError as exc:
        raise _fail(
            ErrorClass.NETWORK, f"{method} {url}: cannot connect ({exc.os_error})"
        ) from None
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise _fail(ErrorClass.UPSTREAM_PROTOCOL, f"{method} {url}: {type(exc).__name__}") from None
    except aiohttp.ClientError as exc:
        raise _fail(ErrorClass.NETWORK, f"{method} {url}: {type(exc).__name__}") from None
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        body = None
    return status, body


def _error_message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error", body.get("message"))
        if isinstance(error, dict):
            return str(error.get("message", ""))[:200]
        if error is not None:
            return str(error)[:200]
    return ""


def _raise_for_status(status: int, body: Any, what: str, *, not_found: ErrorClass) -> None:
    if 200 <= status < 300:
        return
    detail = f"{what}: HTTP {status} {_error_message(body)}".rstrip()
    if status in (401, 403):
        raise _fail(ErrorClass.AUTH, detail)
    if status == 404:
        raise _fail(not_found, detail)
    if status == 429:
        raise DoctorFailure(ErrorClass.RATE_LIMITED.value, detail, "the server sheds load; retry")
    if status >= 500:
        raise _fail(ErrorClass.ENGINE_UNAVAILABLE, detail)
    raise _fail(ErrorClass.UPSTREAM_PROTOCOL, detail)


async def probe_openai_server(
    http: aiohttp.ClientSession,
    base_url: str,
    *,
    model: str,
    api_key: str | None,
    prompt_token_ids: list[int],
) -> str:
    base = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    status, body = await _request(http, "GET", f"{base}/v1/models", headers=headers)
    # A 404 on /v1/models is a wrong address, not a missing model.
    _raise_for_status(status, body, "GET /v1/models", not_found=ErrorClass.UPSTREAM_PROTOCOL)
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise _fail(ErrorClass.UPSTREAM_PROTOCOL, "GET /v1/models: not an OpenAI model list")
    served = [item.get("id") for item in body["data"] if isinstance(item, dict)]
    if model not in served:
        raise _fail(
            ErrorClass.MODEL_NOT_FOUND,
            f"model {model!r} is not served here (served: {', '.join(map(str, served)) or 'none'})",
        )

    payload = {"model": model, "prompt": prompt_token_ids, "max_tokens": 1, "temperature": 0}
    status, body = await _request(
        http, "POST", f"{base}/v1/completions", headers=headers, payload=payload
    )
    _raise_for_status(status, body, "POST /v1/completions", not_found=ErrorClass.MODEL_NOT_FOUND)
    choices = body.get("choices") if isinstance(body, dict) else None
    if (
        not isinstance(choices, list)
        or not choices
        or not isinstance(choices[0], dict)
        or not isinstance(choices[0].get("text"), str)
    ):
        raise _fail(ErrorClass.UPSTREAM_PROTOCOL, "POST /v1/completions: no choices[0].text")
    usage = body.get("usage") if isinstance(body, dict) else None
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return (
        f"{base}: {model} served, generated {completion if completion is not None else '?'} token"
    )
