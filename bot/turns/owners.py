"""Whose a conversation is: the tenants' namespaces.

Every conversation has one owner (``conversations.owner``), and a turn, its
history, its fair use and its cache salt are only ever reached through it.
Owners come from two places that must never meet:

* a platform tenant, named by its channel: ``telegram:{bot}``, ``webhook:{name}``,
  a Slack workspace's team id (``T0123ABCD``);
* an API key's owner, the free text an operator gave ``botctl keys create
  --owner``. As a tenant it is always ``key:{owner}``.

The prefix is what keeps them apart: a key created with the owner
``telegram:support`` acts for the tenant ``key:telegram:support``, which no
platform ever uses, so it cannot read or regenerate that bot's turns (nor share
its KV-cache salt). No platform's tenant starts with ``key:``: Telegram's and
the webhook's start with their channel kind, and a Slack team id is
upper-case letters and digits (``bot.channels.ids``).
"""

from __future__ import annotations

KEY_OWNER_PREFIX = "key:"
OWNER_COLUMN_CHARS = 200
"""``conversations.owner`` and ``openai_exchanges.owner`` hold this many characters."""
KEY_OWNER_MAX_CHARS = OWNER_COLUMN_CHARS - len(KEY_OWNER_PREFIX)
"""The longest owner a key may be given: its tenant, prefixed, still fits the column."""


def key_tenant(owner: str) -> str:
    """The tenant an API key with this owner acts for."""
    return f"{KEY_OWNER_PREFIX}{owner}"


def check_key_owner(owner: str) -> str:
    """``owner`` if a key may be given it, else ``ValueError`` saying why."""
    if not owner.strip():
        raise ValueError("a key's owner must not be empty")
    if len(owner) > KEY_OWNER_MAX_CHARS:
        raise ValueError(f"a key's owner has at most {KEY_OWNER_MAX_CHARS} characters")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in owner):
        raise ValueError("a key's owner must not contain control characters")
    return owner
