"""Configuration of one Discord application (``[[discord]]`` tables in the TOML file).

The pacing defaults follow Discord's developer docs: a message may be edited
about once a second before its route's bucket runs dry (the ``X-RateLimit-*``
headers say exactly when), a message holds at most 2,000 characters, and an
interaction's token may be used for 15 minutes after the interaction arrived.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from bot.channels.access import GroupPolicy, listed, may_talk
from bot.channels.kind import ChannelKind

DISCORD_API_BASE_URL = "https://discord.com/api/v10"
MAX_MESSAGE_CHARS = 2000
"""Discord refuses a message whose ``content`` is longer."""
MIN_MESSAGE_CHARS = 100
"""Room for a closed code fence and a few words; lower only makes sense in tests."""
EDIT_INTERVAL_S = 1.0
"""About one edit a second per message: smooth to read, well inside every bucket."""
POST_INTERVAL_S = 1.0
"""Spacing of new messages in one channel (a reply continued past 2,000 characters)."""
MAX_RETRY_WAIT_S = 120.0
"""The time one reply may lose to retried failures (429s, 5xx, the network) before it gives up
instead of stalling its turn (``bot.channels.delivery_retry``)."""
REQUEST_TIMEOUT_S = 10.0
SIGNATURE_WINDOW_S = 300.0
"""An interaction whose ``X-Signature-Timestamp`` is further off than this is a replay: 401."""
GATEWAY_LEASE_POLL_S = 5.0
"""How often a worker without the gateway tries to take it (after its holder died)."""
_SNOWFLAKE = re.compile(r"^[0-9]{1,20}$")
_PUBLIC_KEY = re.compile(r"^[0-9a-fA-F]{64}$")


class DiscordBotSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Path segment of the interactions endpoint: ``POST /discord/{name}``."""
    application_id: str
    """The application's id (Developer Portal → General Information)."""
    public_key: str
    """The application's public key, hex: it verifies every interaction's signature."""
    token: SecretStr
    """The bot's token: the gateway, messages in channels, registering commands."""
    api_base_url: str = DISCORD_API_BASE_URL
    gateway: bool = False
    """Hold a gateway connection for mentions and DMs (one worker of several holds it)."""
    groups: GroupPolicy = "mention"
    """Server channels, over the gateway: ``off`` refuses with a notice, ``mention`` answers
    messages that mention the bot or reply to it, ``all`` every message (the privileged
    Message Content intent is needed for anything but mentions and DMs). ``/ask`` in a
    server channel is refused under ``off`` too."""
    allowed_users: list[str] = Field(default_factory=list)
    """Discord user ids (``80351110224678912``) who may talk to the bot; empty: everyone."""
    admins: list[str] = Field(default_factory=list)
    """Always allowed, never held to fair-use limits, may use ``/stats all``."""

    edit_interval_s: float = Field(EDIT_INTERVAL_S, ge=0)
    post_interval_s: float = Field(POST_INTERVAL_S, ge=0)
    max_message_chars: int = Field(MAX_MESSAGE_CHARS, ge=MIN_MESSAGE_CHARS, le=MAX_MESSAGE_CHARS)
    """Replies longer than this continue in a new message (lower it only to test splitting)."""
    max_retry_wait_s: float = Field(MAX_RETRY_WAIT_S, ge=0)
    request_timeout_s: float = Field(REQUEST_TIMEOUT_S, gt=0)
    signature_window_s: float = Field(SIGNATURE_WINDOW_S, gt=0)
    gateway_lease_poll_s: float = Field(GATEWAY_LEASE_POLL_S, gt=0)

    @field_validator("application_id")
    @classmethod
    def _snowflake(cls, value: str) -> str:
        if not _SNOWFLAKE.match(value):
            raise ValueError("application_id is a Discord id: digits only")
        return value

    @field_validator("public_key")
    @classmethod
    def _hex_key(cls, value: str) -> str:
        if not _PUBLIC_KEY.match(value):
            raise ValueError(
                "public_key is the application's Ed25519 public key: 64 hex characters "
                "(Developer Portal → General Information → Public Key)"
            )
        return value.lower()

    @field_validator("allowed_users", "admins")
    @classmethod
    def _user_ids(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if not _SNOWFLAKE.match(str(entry)):
                raise ValueError(
                    f"{entry!r} is not a Discord user id (digits: User Settings → Advanced → "
                    "Developer Mode, then right-click the user → Copy User ID)"
                )
        return [str(entry) for entry in entries]

    def is_admin(self, user_id: str | None) -> bool:
        """An admin of this bot: no fair-use limits, ``/stats all``."""
        return listed(self.admins, user_id)

    def may_talk(self, user_id: str | None) -> bool:
        """Whether this user may talk to the bot (the allow-list, or an admin)."""
        return may_talk(self.allowed_users, self.admins, user_id)

    @property
    def channel(self) -> str:
        """``InboundMessage.channel`` and owner of this bot's conversations (one cache salt)."""
        return f"discord:{self.name}"


DISCORD = ChannelKind("discord", DiscordBotSettings)
"""Its ``[[discord]]`` tables, its turn channels named ``discord:NAME``."""
