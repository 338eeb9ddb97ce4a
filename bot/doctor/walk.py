"""The doctor's walk: run the layer checks in order, time each, stop at the first failure."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import aiohttp

from bot.channels.discord import doctor as discord_doctor
from bot.channels.discord.settings import DISCORD
from bot.channels.kind import ChannelKind, DoctorCheck
from bot.channels.slack import doctor as slack_doctor
from bot.channels.slack.settings import SLACK
from bot.channels.telegram import doctor as telegram_doctor
from bot.channels.telegram.settings import TELEGRAM
from bot.config import ConfigError, Settings, load_settings
from bot.doctor import model, remote, router, storage
from bot.doctor.report import CheckResult
from bot.engine.base import InferenceEngine
from bot.errors import CONFIG, DoctorFailure, ErrorClass
from bot.storage.redact import redact
from bot.turns.chat_format import ChatFormat

REMOTE_TIMEOUT_S = 10.0
PLATFORM_TIMEOUT_S = 15.0

Emit = Callable[[CheckResult], None]
Announce = Callable[[str], None]


def _load(config_path: str | Path | None) -> Settings:
    try:
        return load_settings(config_path)
    except ConfigError as exc:
        raise DoctorFailure(
            CONFIG, str(exc).replace("\n", "; "), "fix the named keys (file or BOT_* variables)"
        ) from exc


class _Walk:
    def __init__(self, emit: Emit) -> None:
        self.results: list[CheckResult] = []
        self._emit = emit
        self.database_url = ""
        """Once the settings are loaded: masked in every message (it may hold a password)."""

    async def step(self, layer: str, check: Callable[[], Awaitable[str]]) -> bool:
        started = time.perf_counter()
        try:
            detail = await check()
        except DoctorFailure as exc:
            result = CheckResult(
                layer,
                False,
                (time.perf_counter() - started) * 1000,
                exc.message,
                exc.error_class,
                exc.hint,
            )
        except Exception as exc:  # a check's own bug must still give a line, not a traceback
            result = CheckResult(
                layer,
                False,
                (time.perf_counter() - started) * 1000,
                redact(f"{type(exc).__name__}: {str(exc)[:300]}", self.database_url),
                ErrorClass.INTERNAL.value,
            )
        else:
            result = CheckResult(layer, True, (time.perf_counter() - started) * 1000, detail)
        self.results.append(result)
        self._emit(result)
        return result.ok

    def skip(self, layer: str, why: str) -> None:
        result = CheckResult(layer, True, 0.0, why, skipped=True)
        self.results.append(result)
        self._emit(result)


async def run_doctor(
    config_path: str | Path | None,
    *,
    engine: InferenceEngine | None = None,
    skip: Collection[str] = (),
    emit: Emit = lambda _result: None,
    announce: Announce = lambda _text: None,
) -> list[CheckResult]:
    """Check every layer top to bottom; the last result is the first failure, if any.

    ``engine``: an already started local engine to probe instead of starting
    one (tests share theirs). ``skip``: layer groups to leave out
    (``engine``, ``platforms``).
    """
    walk = _Walk(emit)
    loaded: dict[str, Any] = {}

    async def config() -> str:
        settings = _load(config_path)
        loaded["settings"] = settings
        walk.database_url = settings.database.url
        source = str(config_path) if config_path else "defaults and environment"
        counts = ", ".join(f"{len(tables)} {kind.name}" for kind, tables, _ in _checks(settings))
        return f"{source}: engine {settings.engine.kind}, {counts}"

    if not await walk.step("config", config):
        return walk.results
    settings: Settings = loaded["settings"]

    async def database() -> str:
        return await storage.check_database(settings)

    async def migrations() -> str:
        return await storage.check_migrations(settings)

    async def model_folder() -> str:
        return model.check_model_folder(settings)

    async def tokenizer() -> str:
        detail, loaded["chat_format"] = model.check_tokenizer(settings)
        return detail

    for layer, check in (
        ("database", database),
        ("migrations", migrations),
        ("model", model_folder),
        ("tokenizer", tokenizer),
    ):
        if not await walk.step(layer, check):
            return walk.results
    chat_format: ChatFormat = loaded["chat_format"]

    if "engine" in skip:
        walk.skip("engine", "skipped (--skip engine)")
    elif settings.engine.kind == "local":
        announce("starting the local vLLM engine (about 30 s on the demo model) ...")

        async def local_engine() -> str:
            return await model.check_local_engine(settings, chat_format, engine)

        if not await walk.step("engine", local_engine):
            return walk.results
    elif not await _remote_engines(walk, settings, chat_format):
        return walk.results

    if "platforms" in skip:
        walk.skip("platforms", "skipped (--skip platforms)")
        return walk.results
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=PLATFORM_TIMEOUT_S)
    ) as http:
        for kind, tables, doctor in _checks(settings):
            for table in tables:

                async def platform(doctor: DoctorCheck = doctor, table: Any = table) -> str:
                    return await doctor(http, table, settings.server.public_url)

                if not await walk.step(f"{kind.name}:{table.name}", platform):
                    return walk.results
    return walk.results


def _checks(settings: Settings) -> list[tuple[ChannelKind[Any], list[Any], DoctorCheck]]:
    """The channel kinds whose credentials the doctor checks against their platform: each
    with its configured tables and its check."""
    return [
        (TELEGRAM, settings.telegram, telegram_doctor.check),
        (SLACK, settings.slack, slack_doctor.check),
        (DISCORD, settings.discord, discord_doctor.check),
    ]


async def _remote_engines(walk: _Walk, settings: Settings, chat_format: ChatFormat) -> bool:
    engine = settings.engine
    if not engine.base_urls:

        async def missing() -> str:
            raise DoctorFailure(
                CONFIG,
                'engine.kind is "openai" but engine.base_urls is empty',
                'set engine.base_urls = ["http://vllm-host:8000"]',
            )

        return await walk.step("engine", missing)
    model_name = engine.served_model_name or engine.model
    api_key = engine.api_key.get_secret_value() if engine.api_key else None
    prompt = chat_format.first_turn(model.PROBE_TEXT).token_ids
    timeout = aiohttp.ClientTimeout(total=min(REMOTE_TIMEOUT_S, engine.request_timeout_s))
    # trust_env: the service's own client honours HTTP(S)_PROXY, so the doctor does too.
    async with aiohttp.ClientSession(timeout=timeout, trust_env=True) as http:
        for base_url in engine.base_urls:

            async def probe(base_url: str = base_url) -> str:
                served = await remote.probe_openai_server(
                    http, base_url, model=model_name, api_key=api_key, prompt_token_ids=prompt
                )
                found = await router.detect_router(http, base_url, api_key)
                if found is None:
                    return served
                # One router URL: the router picks the replica, the service routes nothing.
                routing = (
                    "; the router picks the replica"
                    if len(engine.base_urls) == 1
                    else "; the service ranks this URL among the others"
                )
                return f"{served}; {found.describe()}{routing}"

            if not await walk.step(f"engine {base_url}", probe):
                return False
    return True
