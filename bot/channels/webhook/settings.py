"""Configuration of one generic signed webhook integration (``[[webhooks]]``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from bot.channels.kind import ChannelKind

DEFAULT_CALLBACK_TIMEOUT_S = 10.0
DEFAULT_RETRY_FOR_S = 60.0
DEFAULT_RETRY_BACKOFF_S = 0.5
DEFAULT_CHUNK_INTERVAL_S = 0.25
MIN_SECRET_CHARS = 16


class WebhookSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Path segment: ``POST /webhooks/{name}``; also the channel ``webhook:{name}``."""
    secret: SecretStr
    """Signs both directions: inbound messages and our callbacks (HMAC-SHA256)."""
    previous_secrets: list[SecretStr] = Field(default_factory=list)
    """While rotating: inbound messages signed with one of these are still accepted.

    Callbacks are signed with ``secret`` only (docs/webhook.md, "Rotating the secret")."""
    callback_url: str = Field(pattern=r"^https?://")
    """Where replies are POSTed: https, unless ``allow_http_callback``. Redirects are not
    followed (a 3xx is a refusal): the signed reply goes to this URL or nowhere."""
    allow_http_callback: bool = False
    """Allow an ``http://`` callback_url (a receiver on the same host or a private network):
    without TLS the replies can be read and altered on the way."""
    callback_timeout_s: float = Field(DEFAULT_CALLBACK_TIMEOUT_S, gt=0)
    """One callback attempt may take this long."""
    retry_for_s: float = Field(DEFAULT_RETRY_FOR_S, ge=0)
    """A failing callback is retried for this long, then the turn fails as ``delivery``."""
    retry_backoff_s: float = Field(DEFAULT_RETRY_BACKOFF_S, gt=0)
    """First wait between attempts; it doubles up to ``delivery_retry.MAX_BACKOFF_S`` (8 s)."""
    chunk_interval_s: float = Field(DEFAULT_CHUNK_INTERVAL_S, ge=0)
    """Least time between two chunk callbacks of one reply; text in between is merged."""

    @field_validator("secret")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < MIN_SECRET_CHARS:
            raise ValueError(f"must have at least {MIN_SECRET_CHARS} characters")
        return value

    @model_validator(mode="after")
    def _https_unless_allowed(self) -> WebhookSettings:
        if self.callback_url.startswith("http://") and not self.allow_http_callback:
            raise ValueError(
                "callback_url must be https:// (set allow_http_callback = true to allow http://)"
            )
        return self

    @field_validator("previous_secrets")
    @classmethod
    def _all_long_enough(cls, values: list[SecretStr]) -> list[SecretStr]:
        for value in values:
            cls._long_enough(value)
        return values


WEBHOOK = ChannelKind("webhook", WebhookSettings)
"""Its ``[[webhooks]]`` tables, its turn channels named ``webhook:NAME``."""
