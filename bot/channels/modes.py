"""``/mode``: start a fresh conversation with a persona; the same words on every chat platform.

A persona is chosen when a conversation starts and never changes after (its
system prompt opens the token-exact history that every later prompt, and the
engine's prefix cache, is built on), so ``/mode NAME`` always starts a new
conversation. The name the user typed is data: it is only looked up, and the
notices below never repeat it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.turns.personas import Personas
from bot.turns.service import TurnService

WHY_FRESH = (
    "A persona is chosen when a conversation starts and cannot change in the middle of it: "
    "its instructions open the conversation, and everything after is built on them "
    "(changing them would rewrite the start of the whole history), so choosing one "
    "starts a new conversation."
)
NO_PERSONAS_TEXT = "No personas are set up for this bot."


@dataclass(frozen=True)
class ModeRequest:
    persona: str | None
    """The configured name to start with; None when only a notice is due."""
    notice: str


def persona_list(personas: Personas | None, *, command: str) -> str:
    if personas is None or not personas.presets:
        return NO_PERSONAS_TEXT
    lines = [f"Personas ({command} NAME starts a new conversation with one):"]
    for preset in personas.presets:
        lines.append(f"{preset.name} - {preset.description}" if preset.description else preset.name)
    return "\n".join(lines) + "\n\n" + WHY_FRESH


def read_mode(args: str, personas: Personas | None, *, command: str = "/mode") -> ModeRequest:
    """What ``/mode ARGS`` asks for: a persona to start with, or the list."""
    if not args.strip():
        return ModeRequest(None, persona_list(personas, command=command))
    preset = personas.get(args) if personas is not None else None
    if preset is None:
        return ModeRequest(
            None, "I do not know that persona.\n\n" + persona_list(personas, command=command)
        )
    started = f"Started a new conversation as {preset.name}."
    if preset.description:
        started += f" ({preset.description})"
    return ModeRequest(preset.name, started + " /new goes back to the default.")


async def run_mode(
    args: str,
    *,
    turns: TurnService,
    channel: str,
    owner: str,
    conversation_key: str,
    command: str = "/mode",
) -> str:
    """Carry out ``/mode ARGS`` for one chat's conversation key; the notice to answer with."""
    request = read_mode(args, turns.personas, command=command)
    if request.persona is not None:
        await turns.new_conversation(
            channel=channel, owner=owner, conversation_key=conversation_key, persona=request.persona
        )
    return request.notice
