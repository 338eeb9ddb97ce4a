"""Configuration of one Slack app (``[[slack]]`` tables in the TOML file)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from bot.channels.access import GroupPolicy, listed, may_talk
from bot.channels.kind import ChannelKind

SLACK_API_BASE_URL = "https://slack.com/api/"

# chat.appendStream is Tier 4 (100+ calls a minute per workspace); two calls a
# second per message streams smoothly and leaves room for several turns at once.
DEFAULT_STREAM_INTERVAL_S = 0.5
# chat.update is Tier 3 (about 50 a minute per workspace) and chat.postMessage
# allows about one message a second per channel: one edit a second per message.
DEFAULT_UPDATE_INTERVAL_S = 1.0
DEFAULT_POST_INTERVAL_S = 1.0
# Slack truncates a message past 40,000 characters and advises at most 4,000
# for readability; longer replies continue in further messages of the thread.
DEFAULT_MAX_MESSAGE_CHARS = 4000
SLACK_MAX_TEXT_CHARS = 40_000
# Room for a closed code fence and a few words; lower only makes sense in tests.
MIN_MESSAGE_CHARS = 40
# The time one reply may lose to retried failures (429s, 5xx, the network) before it gives up.
DEFAULT_MAX_RETRY_WAIT_S = 120.0
DEFAULT_API_TIMEOUT_S = 10
# users.info answers are cached; display names change rarely.
DEFAULT_USER_CACHE_TTL_S = 3600.0
DEFAULT_USER_CACHE_SIZE = 5000
# The handler has 3 s to acknowledge; a name lookup may use at most this much of it.
DEFAULT_USER_LOOKUP_TIMEOUT_S = 1.0

StreamingMode = Literal["auto", "stream", "update"]
_USER_ID = re.compile(r"^[UW][A-Z0-9]{2,}$")


class SlackAppSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    """Names the channel instance: ``slack:{name}``."""
    signing_secret: SecretStr
    bot_token: SecretStr
    api_base_url: str = SLACK_API_BASE_URL
    app_id: str | None = None
    """The app's ``api_app_id``; when set, events of other apps are never taken for this one."""
    streaming: StreamingMode = "auto"
    """``stream``: chat.startStream/appendStream/stopStream; ``update``: chat.postMessage +
    chat.update; ``auto``: stream, falling back to update where the workspace lacks the methods."""
    stream_interval_s: float = Field(DEFAULT_STREAM_INTERVAL_S, ge=0)
    update_interval_s: float = Field(DEFAULT_UPDATE_INTERVAL_S, ge=0)
    post_interval_s: float = Field(DEFAULT_POST_INTERVAL_S, ge=0)
    """Spacing of new messages (chat.postMessage, chat.startStream) in one channel."""
    max_message_chars: int = Field(
        DEFAULT_MAX_MESSAGE_CHARS, ge=MIN_MESSAGE_CHARS, le=SLACK_MAX_TEXT_CHARS
    )
    max_retry_wait_s: float = Field(DEFAULT_MAX_RETRY_WAIT_S, ge=0)
    api_timeout_s: int = Field(DEFAULT_API_TIMEOUT_S, gt=0)
    user_cache_ttl_s: float = Field(DEFAULT_USER_CACHE_TTL_S, ge=0)
    user_lookup_timeout_s: float = Field(DEFAULT_USER_LOOKUP_TIMEOUT_S, gt=0)

    allowed_users: list[str] = Field(default_factory=list)
    """Slack user ids (``U0123ABCD``) who may talk to the app; empty: everyone."""
    admins: list[str] = Field(default_factory=list)
    """Always allowed, never held to fair-use limits, may use admin commands in chat."""
    channels: GroupPolicy = "mention"
    """``off``: a notice, no answers in channels; ``mention``: ``app_mention`` only; ``all``:
    every channel message (subscribe to ``message.channels`` / ``message.groups``)."""

    @field_validator("allowed_users", "admins")
    @classmethod
    def _user_ids(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if not _USER_ID.match(entry):
                raise ValueError(
                    f"{entry!r} is not a Slack user id (U or W and capitals or digits, "
                    "as in the member's profile: ⋮ → Copy member ID)"
                )
        return entries

    def is_admin(self, user_id: str | None) -> bool:
        """An admin of this app: no fair-use limits, admin commands in chat."""
        return listed(self.admins, user_id)

    def may_talk(self, user_id: str | None) -> bool:
        """Whether this user may talk to the app (the allow-list, or an admin)."""
        return may_talk(self.allowed_users, self.admins, user_id)


SLACK = ChannelKind("slack", SlackAppSettings)
"""Its ``[[slack]]`` tables, its turn channels named ``slack:NAME``."""
