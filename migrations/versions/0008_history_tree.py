"""the history is a tree: regenerated replies and edited messages branch off it

Each ``messages`` row names the entry it extends (``parent_seq``) and each
conversation its active branch's last entry (``head_seq``); a turn records
where its prompt forks off (``parent_seq``) and which turn it regenerates or
edits. Existing conversations are linear: each row's parent is the row before
it, the head is the last row. See ``bot.storage.models.Message``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parent_seq", sa.Integer(), nullable=True))
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("head_seq", sa.Integer(), nullable=True))
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parent_seq", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("regenerates_turn_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("edits_turn_id", sa.String(length=32), nullable=True))
        batch_op.add_column(
            sa.Column("attempt", sa.Integer(), server_default=sa.text("1"), nullable=False)
        )
    # Linear histories become a one-branch tree: parent = the previous row, head = the last.
    op.execute(
        "UPDATE messages SET parent_seq = (SELECT MAX(m.seq) FROM messages m"
        " WHERE m.conversation_id = messages.conversation_id AND m.seq < messages.seq)"
    )
    op.execute(
        "UPDATE conversations SET head_seq = (SELECT MAX(m.seq) FROM messages m"
        " WHERE m.conversation_id = conversations.id)"
    )


def downgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("attempt")
        batch_op.drop_column("edits_turn_id")
        batch_op.drop_column("regenerates_turn_id")
        batch_op.drop_column("parent_seq")
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_column("head_seq")
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_column("parent_seq")
