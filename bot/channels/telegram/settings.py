"""Configuration of one Telegram bot (``[[telegram]]`` tables in the TOML file).

The pacing defaults come from Telegram's published limits (Bots FAQ, "My bot
is hitting limits"): about one message a second in one chat, at most 20
messages a minute in one group, about 30 messages a second overall. Edits and
drafts are paced as messages: Telegram answers a flood of them with 429 too.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from bot.channels.access import GroupPolicy, listed, may_talk
from bot.channels.kind import ChannelKind
from bot.channels.telegram.splitting import MAX_MESSAGE_CHARS

TELEGRAM_API_BASE_URL = "https://api.telegram.org"

PRIVATE_CHAT_MIN_INTERVAL_S = 1.0
"""About one message a second per chat."""
GROUP_CHAT_MIN_INTERVAL_S = 3.0
"""20 messages a minute per group: one every three seconds."""
GLOBAL_MAX_CALLS_PER_S = 30.0
"""About 30 messages a second across all chats of one bot."""
MAX_FLOOD_WAIT_S = 60.0
"""The time one reply may lose to retried failures (429s, 5xx, the network): a wait that would
pass it fails the delivery instead of stalling the turn (``bot.channels.delivery_retry``)."""
TYPING_REFRESH_S = 4.5
"""``sendChatAction`` shows for five seconds at most; refresh a little before it fades."""
REQUEST_TIMEOUT_S = 30.0
_USER_ID = re.compile(r"^[0-9]{1,20}$")
_USERNAME = re.compile(r"^@?[A-Za-z][A-Za-z0-9_]{3,31}$")


class TelegramBotSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Path segment of the webhook: ``POST /telegram/{name}``."""
    token: SecretStr
    secret_token: SecretStr | None = None
    """Expected in ``X-Telegram-Bot-Api-Secret-Token``; set by ``botctl telegram set-webhook``."""
    api_base_url: str = TELEGRAM_API_BASE_URL
    username: str | None = None
    """The bot's @username, without the @. Looked up with ``getMe`` when not set."""
    format: str = Field("html", pattern=r"^(html|plain)$")
    """``html``: convert the model's Markdown to Telegram HTML; ``plain``: send text as is."""

    private_min_interval_s: float = Field(PRIVATE_CHAT_MIN_INTERVAL_S, ge=0)
    """Least time between two calls (draft, message, edit) to one private chat."""
    group_min_interval_s: float = Field(GROUP_CHAT_MIN_INTERVAL_S, ge=0)
    """Least time between two calls (message, edit) to one group chat."""
    global_max_calls_per_s: float = Field(GLOBAL_MAX_CALLS_PER_S, gt=0)
    max_flood_wait_s: float = Field(MAX_FLOOD_WAIT_S, ge=0)
    typing_refresh_s: float = Field(TYPING_REFRESH_S, gt=0)
    request_timeout_s: float = Field(REQUEST_TIMEOUT_S, gt=0)
    max_message_chars: int = Field(MAX_MESSAGE_CHARS, ge=64, le=MAX_MESSAGE_CHARS)
    """Replies longer than this continue in a new message (lower it only to test splitting)."""

    allowed_users: list[str] = Field(default_factory=list)
    """Who may talk to the bot: user ids (``123456789``) or ``@usernames``; empty: everyone.
    Ids are safer: a username can be changed and then taken by someone else."""
    admins: list[str] = Field(default_factory=list)
    """Always allowed, never held to fair-use limits, may use admin commands in chat."""
    groups: GroupPolicy = "mention"
    """``off``: a notice, no answers in groups; ``mention``: only messages addressed to the
    bot; ``all``: every message (needs the bot's privacy mode off in @BotFather)."""

    @field_validator("allowed_users", "admins")
    @classmethod
    def _ids_or_usernames(cls, entries: list[str]) -> list[str]:
        normalised = []
        for entry in entries:
            entry = str(entry).strip()
            if _USER_ID.match(entry):
                normalised.append(entry)
            elif _USERNAME.match(entry):
                # Telegram compares usernames case-insensitively.
                normalised.append(entry.removeprefix("@").lower())
            else:
                raise ValueError(
                    f"{entry!r} is neither a Telegram user id (digits) nor a @username"
                )
        return normalised

    def is_admin(self, user_id: str | None, username: str | None = None) -> bool:
        """An admin of this bot: no fair-use limits, admin commands in chat."""
        return listed(self.admins, user_id, username.lower() if username else None)

    def may_talk(self, user_id: str | None, username: str | None = None) -> bool:
        """Whether this user may talk to the bot (the allow-list, or an admin)."""
        return may_talk(
            self.allowed_users, self.admins, user_id, username.lower() if username else None
        )

    @property
    def bot_id(self) -> int | None:
        """The bot's user id: a token is ``{bot_id}:{secret}``."""
        head, _, _ = self.token.get_secret_value().partition(":")
        return int(head) if head.isdigit() else None

    @property
    def channel(self) -> str:
        """``InboundMessage.channel`` (and owner) of this bot's conversations."""
        return f"telegram:{self.name}"


TELEGRAM = ChannelKind("telegram", TelegramBotSettings)
"""Its ``[[telegram]]`` tables, its turn channels named ``telegram:NAME``."""
