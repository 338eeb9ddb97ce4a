"""The bot's slash commands: what is registered with Discord, and what each one does.

``/ask message:<text>`` is a message to the assistant: the handler stores it
and answers with a deferred response, and the reply streams into it
(``routes.py``). The others act at once and answer in the interaction's
response, shown only to the user who typed the command (an ephemeral
message):

- ``/new`` starts a fresh conversation here (this channel or thread, or this DM),
- ``/stop`` stops the reply being written here,
- ``/stats`` shows the user's usage today; ``/stats scope:all`` every user's, for
  the bot's admins,
- ``/help`` says all this.

A server channel is one conversation shared by everyone in it, as a group is
on Telegram: ``/new`` and ``/stop`` there act on that shared conversation.
"""

from __future__ import annotations

from typing import Any

from bot.channels.discord.payloads import SlashCommand
from bot.channels.stats import NO_ADMINS, AdminCheck, stats_answer
from bot.turns.service import TurnService
from bot.turns.usage import UsageReports

ASK = "ask"
ASK_OPTION = "message"
STRING_OPTION = 3
CHAT_INPUT = 1
# Where the commands may be used: a server (0) and the bot's DMs (1); installed to servers.
CONTEXTS = [0, 1]
GUILD_INSTALL = [0]

HELP_TEXT = (
    "I am an AI assistant.\n"
    "`/ask message:<text>` - ask me anything; I write the answer here\n"
    "Mention me in a channel, or send me a direct message, and I answer that too.\n"
    "`/new` - start a new conversation here (I forget the earlier one)\n"
    "`/stop` - stop the reply I am writing here\n"
    "`/stats` - your messages and tokens today, and your daily limit"
)
NEW_TEXT = "Started a new conversation."
STOPPING_TEXT = "Stopping the reply."
NOTHING_TO_STOP_TEXT = "Nothing to stop."
UNKNOWN_TEXT = "I do not know that command.\n\n" + HELP_TEXT
EMPTY_ASK_TEXT = "Please give me a message: `/ask message:<text>`."


def _command(name: str, description: str, options: list[dict[str, Any]] | None = None) -> Any:
    command: dict[str, Any] = {
        "name": name,
        "type": CHAT_INPUT,
        "description": description,
        "contexts": CONTEXTS,
        "integration_types": GUILD_INSTALL,
    }
    if options:
        command["options"] = options
    return command


COMMANDS: list[dict[str, Any]] = [
    _command(
        ASK,
        "Ask the assistant; the answer is written here",
        [
            {
                "type": STRING_OPTION,
                "name": ASK_OPTION,
                "description": "What to ask",
                "required": True,
                "max_length": 6000,
            }
        ],
    ),
    _command("new", "Start a new conversation here"),
    _command("stop", "Stop the reply being written here"),
    _command(
        "stats",
        "Your messages and tokens today",
        [
            {
                "type": STRING_OPTION,
                "name": "scope",
                "description": "all: every user's usage (the bot's admins only)",
                "required": False,
                "choices": [{"name": "mine", "value": "mine"}, {"name": "all", "value": "all"}],
            }
        ],
    ),
    _command("help", "What this bot does"),
]
"""What ``botctl discord register-commands`` registers (a bulk overwrite, so it is exactly this)."""


async def run_command(
    command: SlashCommand,
    *,
    channel: str,
    turns: TurnService,
    usage: UsageReports,
    is_admin: AdminCheck = NO_ADMINS,
) -> str:
    """Carry out a command other than ``/ask``; the notice to answer with."""
    key = command.place.conversation_key
    if command.name == "new":
        await turns.new_conversation(channel=channel, owner=channel, conversation_key=key)
        return NEW_TEXT
    if command.name == "stop":
        stopping = await turns.cancel_active(channel=channel, owner=channel, conversation_key=key)
        return STOPPING_TEXT if stopping else NOTHING_TO_STOP_TEXT
    if command.name == "stats":
        return await stats_answer(
            usage,
            channel=channel,
            owner=channel,
            user_id=command.place.user_id,
            args=command.options.get("scope", ""),
            is_admin=is_admin,
        )
    if command.name == "help":
        return HELP_TEXT
    return UNKNOWN_TEXT
