"""Slash commands: ``/new`` starts a fresh conversation, ``/stop`` stops the reply, ``/retry``
answers the last message again (``bot.turns.branching``: the earlier reply stays stored),
``/mode NAME`` starts a fresh one with a persona (``bot.channels.modes``),
``/stats`` shows the user's usage today (``/stats all``: every user's, for the app's admins).

Slack POSTs a command as an ``application/x-www-form-urlencoded`` form
(``team_id``, ``channel_id``, ``channel_name``, ``user_id``, ``command``,
``text``, ``api_app_id``, ``response_url``, ...), signed like an event. The
answer is the 200 response itself: ``{"response_type": "ephemeral", "text"}``
is shown to the user who typed the command and to nobody else.

Where the commands apply:

- In a DM with the bot, the DM is one endless conversation; the command
  addresses it with the key ``events.dm_conversation_key`` gives the DM's
  messages, so ``/new`` closes exactly the history those messages extend and
  ``/stop`` stops exactly the reply they are getting, and ``/retry`` answers
  the DM's last message again.
- In a channel (or a group DM) every top-level mention already starts its own
  thread and its own conversation, so ``/new`` has nothing to do; and Slack
  does not let app commands be typed inside a thread, so a command there can
  never say which thread's reply to stop. Guessing (the user's latest thread?
  every reply in the channel?) could stop someone else's answer, so both
  commands only answer that they work in a DM.
- ``/stats`` works anywhere: its answer is ephemeral, seen by the user alone,
  and counts the user's turns in every conversation of the app (DMs and threads).

Events and commands are separate requests: a DM message sent just before
``/new`` may still reach us after it and then belongs to the new conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs

from bot.channels.ids import slack_id, slack_team_id
from bot.channels.modes import WHY_FRESH, run_mode
from bot.channels.retry import run_retry
from bot.channels.slack.payloads import dm_conversation_key
from bot.channels.stats import NO_ADMINS, AdminCheck, stats_answer
from bot.turns.service import TurnService
from bot.turns.usage import UsageReports

HELP_TEXT = (
    "Send me a direct message, or mention me in a channel, and I will answer.\n"
    "In our DM:\n"
    "`/new` - start a new conversation (I forget the earlier one)\n"
    "`/stop` - stop the reply I am writing\n"
    "`/retry` - answer your last message again\n"
    "`/mode` - list personas; `/mode NAME` starts a new conversation with one\n"
    "Anywhere:\n"
    "`/stats` - your messages and tokens today, and your daily limit"
)
UNKNOWN_TEXT = "I do not know that command.\n\n" + HELP_TEXT
NEW_TEXT = "Started a new conversation."
STOPPING_TEXT = "Stopping the reply."
NOTHING_TO_STOP_TEXT = "Nothing to stop."
RETRYING_TEXT = "Answering your last message again."
DM_ONLY_TEXT = (
    "`/new`, `/stop`, `/retry` and `/mode` work in a direct message with me. In a channel, "
    "each thread is its own conversation: mention me at the top level to start a new one."
)
MODE_DM_ONLY_TEXT = DM_ONLY_TEXT + "\n\n" + WHY_FRESH
OTHER_APP_TEXT = "This bot is not set up for this Slack app."

# Slack's channel ids: ``D`` for a DM, ``C``/``G`` for channels and group DMs.
DM_CHANNEL_PREFIX = "D"

CommandName = Literal["new", "stop", "retry", "stats", "mode", "unknown"]
_KNOWN: dict[str, CommandName] = {
    "/new": "new",
    "/stop": "stop",
    "/retry": "retry",
    "/stats": "stats",
    "/mode": "mode",
}


class MalformedCommand(ValueError):
    """A verified form that lacks what every slash command carries."""


@dataclass(frozen=True)
class SlashCommand:
    name: CommandName
    typed: str
    """The command as the user typed it (``/new``), for the log line."""
    api_app_id: str | None
    team_id: str
    channel_id: str
    user_id: str
    text: str = ""
    """What follows the command (``all`` in ``/stats all``, ``pirate`` in ``/mode pirate``)."""

    @property
    def in_dm(self) -> bool:
        return self.channel_id.startswith(DM_CHANNEL_PREFIX)


def parse_form(body: str) -> SlashCommand:
    """One verified form body -> the command; MalformedCommand without its ids."""
    fields = {name: values[0] for name, values in parse_qs(body, keep_blank_values=True).items()}
    typed = fields.get("command", "").strip()
    team_id = fields.get("team_id", "")
    channel_id = fields.get("channel_id", "")
    user_id = fields.get("user_id", "")
    if not (typed and team_id and channel_id and user_id):
        raise MalformedCommand("command, team_id, channel_id or user_id missing")
    # Each is stored (the conversation's owner and key, the turn's user): Slack's shapes only.
    if slack_team_id(team_id) is None or not slack_id(channel_id) or not slack_id(user_id):
        raise MalformedCommand("team_id, channel_id or user_id malformed")
    return SlashCommand(
        name=_KNOWN.get(typed.lower(), "unknown"),
        typed=typed,
        api_app_id=fields.get("api_app_id") or None,
        team_id=team_id,
        channel_id=channel_id,
        user_id=user_id,
        text=fields.get("text", "").strip(),
    )


async def run_command(
    command: SlashCommand,
    *,
    channel: str,
    turns: TurnService,
    usage: UsageReports,
    is_admin: AdminCheck = NO_ADMINS,
) -> str:
    """Carry out ``command`` for the app whose channel instance is ``channel``; the answer."""
    if command.name == "unknown":
        return UNKNOWN_TEXT
    if command.name == "stats":
        # Messages are stored under the workspace as owner (payloads.py).
        return await stats_answer(
            usage,
            channel=channel,
            owner=command.team_id,
            user_id=command.user_id,
            args=command.text,
            is_admin=is_admin,
        )
    if not command.in_dm:
        return MODE_DM_ONLY_TEXT if command.name == "mode" else DM_ONLY_TEXT
    # The owner and key the DM's message events are stored under (payloads.py).
    owner = command.team_id
    key = dm_conversation_key(command.channel_id)
    if command.name == "new":
        await turns.new_conversation(channel=channel, owner=owner, conversation_key=key)
        return NEW_TEXT
    if command.name == "retry":
        notice = await run_retry(turns, channel=channel, owner=owner, conversation_key=key)
        return notice or RETRYING_TEXT  # a slash command is answered, even when the reply follows
    if command.name == "mode":
        return await run_mode(
            command.text, turns=turns, channel=channel, owner=owner, conversation_key=key
        )
    stopping = await turns.cancel_active(channel=channel, owner=owner, conversation_key=key)
    return STOPPING_TEXT if stopping else NOTHING_TO_STOP_TEXT
