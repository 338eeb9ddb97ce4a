"""structlog set-up: JSON lines on stdout (pretty on a terminal), stdlib logs included.

aiohttp's, SQLAlchemy's and vLLM's stdlib loggers go through the same
processors via ``ProcessorFormatter``, so every line of the service has one
shape. Request and conversation ids are bound with ``structlog.contextvars``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

# Loggers that are chatty at INFO and add nothing to our own lines.
_QUIET_LOGGERS = {"aiohttp.access": logging.WARNING, "sqlalchemy.engine": logging.WARNING}


def configure_logging(level: str = "INFO", fmt: str = "auto") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())
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
        else structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty())
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name, quiet_level in _QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(quiet_level)
