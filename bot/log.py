"""structlog set-up: JSON lines on stdout (pretty on a terminal), stdlib logs included.

Commands whose stdout is their answer (``botctl doctor --json``) log to stderr instead.

aiohttp's, SQLAlchemy's and vLLM's stdlib loggers go through the same
processors via ``ProcessorFormatter``, so every line of the service has one
shape. Request and conversation ids are bound with ``structlog.contextvars``.

vLLM logs a score of INFO lines while its engine starts (config resolution,
platform probing, shutdown steps) that bury the service's own lines, so its
loggers are held at WARNING unless ``logging.level`` is DEBUG, or
``VLLM_LOGGING_LEVEL`` names a level for them (vLLM's own variable, honoured
here because vLLM's own logging set-up is turned off).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

import structlog

# Loggers that are chatty at INFO and add nothing to our own lines.
_QUIET_LOGGERS = {"aiohttp.access": logging.WARNING, "sqlalchemy.engine": logging.WARNING}
VLLM_LOGGER = "vllm"
VLLM_QUIET_LEVEL = logging.WARNING
VLLM_LEVEL_ENV = "VLLM_LOGGING_LEVEL"


def vllm_log_level(level: str) -> int:
    """The level of vLLM's loggers: $VLLM_LOGGING_LEVEL, else ours at DEBUG, else >= WARNING.

    A logger's own level decides whether a record propagates to the root
    handler, so the quiet level is never below the configured one (at ERROR,
    vLLM's warnings stay out too).
    """
    levels = logging.getLevelNamesMapping()
    explicit = os.environ.get(VLLM_LEVEL_ENV, "").strip().upper()
    if explicit in levels:
        return levels[explicit]
    ours = levels[level.upper()]
    return ours if ours == logging.DEBUG else max(ours, VLLM_QUIET_LEVEL)


def configure_logging(level: str = "INFO", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Every log line to ``stream`` (stdout unless given), in one shape."""
    stream = sys.stdout if stream is None else stream
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    # vLLM otherwise installs its own handler and prints in its own format.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: a logger cached at its first use keeps the processors of that moment,
        # so a later configuration (a second command in one process, a test's log
        # capture) would never reach it. Assembling one costs microseconds a line.
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name, quiet_level in _QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(quiet_level)
    logging.getLogger(VLLM_LOGGER).setLevel(vllm_log_level(level))
