"""The ``[server]`` table: address, request limits, slow-client deadlines.

Below the channels, which read it, so that they need nothing from ``bot.config``."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_MAX_BODY_BYTES = 64 * 1024
DEFAULT_MAX_TEXT_CHARS = 8000
DEFAULT_MAX_STREAMS_PER_KEY = 32
DEFAULT_SSE_KEEPALIVE_S = 15.0
# Slow clients (bot.http.deadlines): generous for a phone on a bad network, short
# enough that a trickling client cannot hold a connection for long.
DEFAULT_HEADER_TIMEOUT_S = 20.0
DEFAULT_BODY_TIMEOUT_S = 30.0


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, gt=0)
    """Requests with a larger body are refused with 413 before they are read."""
    max_text_chars: int = Field(DEFAULT_MAX_TEXT_CHARS, gt=0)
    """A longer message is never stored: 400 over HTTP, a notice on Telegram and Slack."""
    shutdown_grace_s: float = Field(30.0, ge=0)
    max_streams_per_key: int = Field(DEFAULT_MAX_STREAMS_PER_KEY, gt=0)
    """Event streams (SSE) one API key may hold open on a worker; one more is refused with 429."""
    sse_keepalive_s: float = Field(DEFAULT_SSE_KEEPALIVE_S, gt=0)
    """A comment line is sent on a silent event stream this often, so proxies keep it open."""
    header_timeout_s: float = Field(DEFAULT_HEADER_TIMEOUT_S, gt=0)
    """A request's line and headers must arrive within this (else 408, connection closed);
    also how long an idle keep-alive connection stays open."""
    body_timeout_s: float = Field(DEFAULT_BODY_TIMEOUT_S, gt=0)
    """A request's body must arrive within this once its handler reads it (else 408)."""
    public_url: str | None = None
    """Public HTTPS base URL platforms reach this service at; ``botctl doctor`` checks webhooks."""
    admin_host: str = "127.0.0.1"
    admin_port: int | None = Field(None, ge=0, le=65535)
    """When set, /healthz, /readyz and /metrics are also served here without a key (keep it
    private); on the main port /metrics needs an admin-scope key."""
    cors_origins: list[str] = Field(default_factory=list)
    """Browser origins (``https://chat.example.com``) allowed to call the API from their
    pages, or ``["*"]`` for any; empty (the default): none but the service's own page
    (``bot.http.cors``)."""

    @field_validator("cors_origins")
    @classmethod
    def _origins_are_origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            if origin == "*":
                continue
            parts = urlsplit(origin)
            if (
                parts.scheme not in ("http", "https")
                or not parts.hostname
                or parts.path not in ("", "/")
                or parts.query
                or parts.fragment
                or parts.username is not None
            ):
                raise ValueError(
                    f'{origin!r} is not an origin: scheme://host[:port] with no path, or "*"'
                )
        # Browsers send scheme and host in lower case.
        return [origin.rstrip("/").lower() for origin in origins]
