"""messages: drop the conversation-only index (the unique (conversation_id, seq) covers it)

The unique index on (conversation_id, seq) leads with conversation_id, so it
serves every lookup by conversation alone as well. With both present, a plan
PostgreSQL cached while the table was small could pick the conversation-only
one for the history walk's parent lookup and scan a conversation's every
entry at each step (80 ms for a 400-entry path instead of under 10). One index
less is also one less to update for every stored entry.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_messages_conversation_id"))


def downgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_messages_conversation_id"), ["conversation_id"], unique=False
        )
