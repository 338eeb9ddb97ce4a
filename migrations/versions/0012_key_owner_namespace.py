"""conversations, openai_exchanges: API keys' owners become ``key:{owner}``

An API key's owner and a platform's tenant (``telegram:{bot}``, a Slack team
id) shared one namespace, so a key created with the owner ``telegram:support``
could read and regenerate that bot's turns. A key now acts for the tenant
``key:{owner}`` (``bot.turns.owners``): the conversations the keys' channels
(``api``, ``openai``) stored, and the OpenAI exchanges, move there with them.
``api_keys.owner`` keeps the owner as the operator typed it.

Revision ID: 0012
Revises: 0011
Create Date: 2027-01-10
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The channels whose messages come with an API key (the API and OpenAI kinds).
_KEY_CHANNELS = "('api', 'openai')"


def upgrade() -> None:
    op.execute(
        f"UPDATE conversations SET owner = 'key:' || owner WHERE channel IN {_KEY_CHANNELS}"
    )
    op.execute("UPDATE openai_exchanges SET owner = 'key:' || owner")


def downgrade() -> None:
    op.execute(
        "UPDATE conversations SET owner = substr(owner, 5)"
        f" WHERE channel IN {_KEY_CHANNELS} AND owner LIKE 'key:%'"
    )
    op.execute("UPDATE openai_exchanges SET owner = substr(owner, 5) WHERE owner LIKE 'key:%'")
