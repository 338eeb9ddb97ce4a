"""turns: drop the conversation-only index (the unique (conversation_id, seq) covers it)

As for messages in 0010: the unique index on (conversation_id, seq) leads with
conversation_id and serves every lookup by conversation alone (the claims' open
turns of a conversation, the cascade when a conversation is deleted). The
second index was one more B-tree page written with every turn stored: one of
the ~12 pages an accept's commit writes to SQLite's WAL.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_turns_conversation_id"))


def downgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_turns_conversation_id"), ["conversation_id"], unique=False
        )
