"""Configuration of one generic signed webhook integration (``[[webhooks]]``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, SecretStr


class WebhookSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    """Path segment: ``POST /webhooks/{name}``."""
    secret: SecretStr
    callback_url: str
