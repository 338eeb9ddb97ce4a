"""vLLM's loggers are quiet at the default level and speak at DEBUG or when VLLM_LOGGING_LEVEL asks.

Each case runs in its own interpreter: logging's set-up is process-wide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
EMIT = """
import logging, sys
from bot.log import configure_logging
configure_logging(sys.argv[1], "json")
for name in ("vllm.config.model", "bot.engine.vllm_local"):
    logger = logging.getLogger(name)
    logger.debug("debug line")
    logger.info("info line")
    logger.warning("warning line")
"""
START_ENGINE = """
import asyncio, sys
from bot.config import EngineSettings
from bot.engine.vllm_local import LocalVLLMEngine
from bot.log import configure_logging

async def main() -> None:
    configure_logging("INFO", "json")
    engine = LocalVLLMEngine(EngineSettings(
        model=sys.argv[1], dtype="float32", max_model_len=1024, block_size=32,
        enforce_eager=True, seed=0, cpu_kvcache_space_gib=1,
    ))
    await engine.start()
    await engine.shutdown()

if __name__ == "__main__":
    asyncio.run(main())
"""


def run(script: str, *args: str, env: dict[str, str] | None = None) -> list[dict[str, str]]:
    inherited = {name: value for name, value in os.environ.items() if name != "VLLM_LOGGING_LEVEL"}
    environ = {**inherited, "PYTHONPATH": str(ROOT), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def seen(lines: list[dict[str, str]], prefix: str) -> list[str]:
    return [line["level"] for line in lines if line["logger"].startswith(prefix)]


@pytest.mark.parametrize(
    ("level", "env", "vllm_levels", "bot_levels"),
    [
        ("INFO", None, ["warning"], ["info", "warning"]),
        ("DEBUG", None, ["debug", "info", "warning"], ["debug", "info", "warning"]),
        ("ERROR", None, [], []),
        ("INFO", {"VLLM_LOGGING_LEVEL": "info"}, ["info", "warning"], ["info", "warning"]),
    ],
)
def test_vllm_loggers_follow_the_configured_level(
    level: str, env: dict[str, str] | None, vllm_levels: list[str], bot_levels: list[str]
) -> None:
    lines = run(EMIT, level, env=env)
    assert seen(lines, "vllm.") == vllm_levels
    assert seen(lines, "bot.") == bot_levels


def test_engine_start_at_info_logs_no_vllm_info_lines(demo_model_dir: Path) -> None:
    lines = run(START_ENGINE, str(demo_model_dir))
    assert [line["event"] for line in lines if line["logger"] == "bot.engine.vllm_local"] == [
        "engine_starting",
        "engine_started",
        "engine_stopped",
    ]
    assert [line["event"] for line in lines if line["logger"].startswith("vllm.")
            and line["level"] == "info"] == []  # fmt: skip


RECONFIGURED = """
import structlog
from bot.log import configure_logging

log = structlog.get_logger("bot.somewhere")
configure_logging("INFO", "json")
log.info("first")
configure_logging("INFO", "json")  # a second command in the same process
with structlog.testing.capture_logs() as captured:
    log.info("second")
print("captured", [entry["event"] for entry in captured])
"""


def test_a_configuration_made_later_reaches_loggers_already_used() -> None:
    # A command run in-process (botctl doctor) configures logging for the process; a
    # later reconfiguration (a test's log capture, a serve after a doctor) must still
    # reach every module's logger, or log lines go nowhere anyone looks.
    done = subprocess.run(
        [sys.executable, "-c", RECONFIGURED],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "captured ['second']" in done.stdout
