"""The bot's commands: ``/start`` and ``/help`` explain, ``/new`` starts over, ``/stop`` stops,
``/retry`` answers the last message again (``bot.turns.branching``: the earlier reply is kept),
``/mode NAME`` starts over with a persona (``bot.channels.modes``),
``/stats`` shows the sender's usage today (``/stats all``: everyone's, for admins).

``/new`` and ``/stop`` act before the webhook answers, so they take effect in
the order the chat sent them (Telegram sends a chat's next update only after
this one is answered); the short notice that confirms them goes out after.
"""

from __future__ import annotations

from bot.channels.modes import run_mode
from bot.channels.stats import NO_ADMINS, AdminCheck, stats_answer
from bot.channels.telegram.payloads import Command
from bot.turns.branching import ForkRefused
from bot.turns.service import TurnService
from bot.turns.usage import UsageReports

HELP_TEXT = (
    "I am an AI assistant: send me a message and I will answer.\n"
    "In a group, mention me or reply to one of my messages.\n\n"
    "/new - start a new conversation (I forget the earlier one)\n"
    "/stop - stop the reply I am writing\n"
    "/retry - answer your last message again\n"
    "Edit your last message and I answer the new text instead.\n"
    "/stats - your messages and tokens today, and your daily limit\n"
    "/mode - list personas; /mode NAME starts a new conversation with one (a persona "
    "cannot change mid-conversation: it opens the history everything after is built on)\n"
    "/help - this help"
)
NEW_TEXT = "Started a new conversation."
NOTHING_TO_STOP_TEXT = "Nothing to stop."
NOTHING_TO_RETRY_TEXT = "Nothing to retry: send me a message first."
RETRY_REFUSED_TEXT = "I cannot retry now: {reason}."
EDIT_REFUSED_TEXT = (
    "Only your last message can be edited: I answered the later ones from the old text. "
    "Send the correction as a new message."
)
UNKNOWN_TEXT = "I do not know that command.\n\n" + HELP_TEXT


async def run_command(
    command: Command,
    *,
    channel: str,
    turns: TurnService,
    usage: UsageReports,
    is_admin: AdminCheck = NO_ADMINS,
) -> str | None:
    """Carry out ``command``; returns the notice to send, or None when the reply says it all."""
    if command.name == "new":
        await turns.new_conversation(
            channel=channel, owner=channel, conversation_key=command.conversation_key
        )
        return NEW_TEXT
    if command.name == "stop":
        cancelled = await turns.cancel_active(
            channel=channel, owner=channel, conversation_key=command.conversation_key
        )
        # A cancelled reply ends with "Stopped." in its own message: no second notice.
        return None if cancelled else NOTHING_TO_STOP_TEXT
    if command.name == "stats":
        # A bot's turns are stored under its channel as owner (updates.py).
        return await stats_answer(
            usage,
            channel=channel,
            owner=channel,
            user_id=command.user_id,
            args=command.args,
            is_admin=is_admin,
        )
    if command.name == "retry":
        try:
            accepted = await turns.regenerate_latest(
                channel=channel, owner=channel, conversation_key=command.conversation_key
            )
        except ForkRefused as exc:
            return RETRY_REFUSED_TEXT.format(reason=exc.reason)
        if accepted is None:
            return NOTHING_TO_RETRY_TEXT
        if accepted.rate_limited is not None:
            return accepted.rate_limited.user_message
        return None  # the new reply says it all
    if command.name == "mode":
        return await run_mode(
            command.args,
            turns=turns,
            channel=channel,
            owner=channel,
            conversation_key=command.conversation_key,
        )
    if command.name == "unknown":
        return UNKNOWN_TEXT
    return HELP_TEXT
